"""Where a profile runs: a real device (cpu, cuda, neuron) or a named target estimated without hardware.

``device="fake:<target>"`` profiles under ``FakeTensorMode`` (no real memory is touched, so models far
too big for this machine work) and turns each operator's FLOPs (``FlopCounterMode``) and bytes moved
into a time through a roofline: ``time = max(flops / peak_flops[dtype], bytes / bandwidth)``
(Williams et al., "Roofline", CACM 2009).  Peak figures are the vendors' published dense numbers per
chip/GPU; fp32 matmuls count at the non-tensor-core rate because PyTorch keeps TF32 off for matmuls by
default.  Every estimated figure is labelled so (``DeviceInfo.estimated``).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from memviz.hardware import accelerator

GiB = 1024**3
TFLOP = 1e12
TBps = 1e12


@dataclass(frozen=True)
class Target:
    """A device model for estimates: peak FLOP/s per dtype, memory bandwidth (B/s), capacity (bytes)."""

    name: str
    peak_flops: dict[str, float]
    bandwidth: float
    capacity_bytes: int
    description: str = ""

    def flops_per_second(self, dtype: torch.dtype | str) -> float:
        key = str(dtype).replace("torch.", "")
        return self.peak_flops.get(key, self.peak_flops["float32"])

    def op_time(self, flops: float, bytes_moved: float, dtype: torch.dtype | str) -> float:
        """Roofline time of one operator: bound by compute or by memory traffic, whichever is slower."""
        return max(flops / self.flops_per_second(dtype), bytes_moved / self.bandwidth)


def _t(name: str, fp32: float, bf16: float, fp64: float, bw: float, cap_gib: float, desc: str) -> Target:
    return Target(name, {"float32": fp32 * TFLOP, "bfloat16": bf16 * TFLOP, "float16": bf16 * TFLOP,
                         "float64": fp64 * TFLOP}, bw * TBps, int(cap_gib * GiB), desc)


#: Named targets (per GPU / per accelerator chip; dense peak numbers from the vendors' data sheets).
TARGETS: dict[str, Target] = {t.name: t for t in (
    _t("cpu", 1.0, 2.0, 0.5, 0.1, 64, "a 16-core AVX-512 server socket (rough)"),
    _t("v100-16gb", 15.7, 125.0, 7.8, 0.9, 16, "NVIDIA V100 SXM2 16 GB"),
    _t("a100-40gb", 19.5, 312.0, 19.5, 1.555, 40, "NVIDIA A100 SXM 40 GB"),
    _t("a100-80gb", 19.5, 312.0, 19.5, 2.039, 80, "NVIDIA A100 SXM 80 GB"),
    _t("h100", 67.0, 989.0, 67.0, 3.35, 80, "NVIDIA H100 SXM 80 GB"),
    _t("h200", 67.0, 989.0, 67.0, 4.8, 141, "NVIDIA H200 SXM 141 GB"),
    _t("trn1", 47.5, 190.0, 47.5 / 4, 0.82, 32, "AWS Trainium1 chip (2 NeuronCore-v2)"),
    _t("trn2", 181.0, 667.0, 181.0 / 4, 2.9, 96, "AWS Trainium2 chip (8 NeuronCore-v3)"),
    _t("inf2", 47.5, 190.0, 47.5 / 4, 0.82, 32, "AWS Inferentia2 chip (2 NeuronCore-v2)"),
)}
TARGETS["a100"] = TARGETS["a100-80gb"]
TARGETS["v100"] = TARGETS["v100-16gb"]
#: the named targets that are CUDA GPUs
CUDA_TARGETS = frozenset(name for name, t in TARGETS.items() if t.description.startswith("NVIDIA"))


def uses_caching_allocator(device_name: str) -> bool:
    """Whether PyTorch serves this device's tensors through the CUDA caching allocator that
    `solvers.allocator` simulates: a CUDA device (``cuda:0 (...)``) or a named CUDA target
    (``fake:h100``).  The CPU allocator caches no segments, and Neuron and XLA devices manage their
    memory their own way: no allocator model for them (issue 18 item 1)."""
    name = device_name.lower()
    return name.startswith("cuda") or name.removeprefix("fake:") in CUDA_TARGETS


class DeviceUnavailable(RuntimeError):
    """The requested device is not usable in this process; the message says what to do."""


@dataclass(frozen=True)
class DeviceInfo:
    """The device a profile belongs to.  `estimated`: times (and peaks) come from the roofline model.
    `per_graph`: the device runs whole graphs (torch-xla, `memviz.hardware.xla`): the step's time and peak are
    measured, each operator's time is its roofline share (`target`) of the measured step."""

    name: str
    estimated: bool
    capacity_bytes: int | None
    torch_device: torch.device
    target: Target | None = field(default=None, compare=False)
    per_graph: bool = False

    @property
    def timing(self) -> str:
        """How operator times were found: "estimated", "per-graph" or "per-op" (measured each)."""
        return "estimated" if self.estimated else "per-graph" if self.per_graph else "per-op"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "estimated": self.estimated, "capacity_bytes": self.capacity_bytes,
                "timing": self.timing}


def _model_device(model: torch.nn.Module, args: Any) -> torch.device:
    for t in (*model.parameters(), *model.buffers(), *pytree.tree_leaves(args)):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _cpu_capacity() -> int | None:
    try:
        import os

        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def resolve_device(device: str | torch.device | None, model: torch.nn.Module, args: Any) -> DeviceInfo:
    """``None``: where the model lives; ``"cpu"``; ``"cuda[:N]"``; ``"neuron"``; ``"xla[:N]"`` (torch-xla,
    measured per graph); ``"fake:<target>"``."""
    if device is None:
        device = _model_device(model, args)
        if device.type == "meta":
            raise DeviceUnavailable("the model lives on the meta device: pass device='fake:<target>' "
                                    f"(targets: {', '.join(sorted(TARGETS))})")
    return named_device(device)


def named_device(device: str | torch.device) -> DeviceInfo:
    """The device `device` names, or a `DeviceUnavailable` saying what to use instead (the CLI asks before
    it builds the model)."""
    if isinstance(device, str) and device.startswith("fake:"):
        key = device.split(":", 1)[1].lower()
        if key not in TARGETS:
            raise DeviceUnavailable(f"unknown target {key!r}; known targets: {', '.join(sorted(TARGETS))}")
        t = TARGETS[key]
        return DeviceInfo(f"fake:{t.name}", True, t.capacity_bytes, torch.device("cpu"), t)
    if str(device).split(":")[0] == "xla":  # also a model already moved to the XLA device
        from memviz.hardware import xla

        return xla.resolve(device)
    if isinstance(device, str) and device.split(":")[0] == "neuron":
        return _neuron_device(device)
    try:
        dev = torch.device(device)
    except RuntimeError:  # torch lists every backend it knows, most of which memviz does not profile
        raise DeviceUnavailable(_unsupported(device)) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable("CUDA is not available in this process; use device='cpu' or "
                                    "device='fake:h100' (or another target) for an estimate")
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        dev = torch.device("cuda", idx)
        props = torch.cuda.get_device_properties(idx)
        return DeviceInfo(f"cuda:{idx} ({props.name})", False, int(props.total_memory), dev)
    if dev.type == "neuron":  # a model already moved to the TorchNeuron device
        return _neuron_device(str(dev))
    if dev.type == "cpu":
        return DeviceInfo("cpu", False, _cpu_capacity(), dev)
    raise DeviceUnavailable(_unsupported(device))


def _unsupported(device: Any) -> str:
    return (f"unsupported device {str(device)!r}: use 'cpu', 'cuda', 'neuron', 'xla' or 'fake:<target>' "
            f"(targets: {', '.join(sorted(TARGETS))})")


def _neuron_device(device: str) -> DeviceInfo:
    """The eager TorchNeuron device: importing ``torch_neuronx`` registers ``neuron`` as PyTorch's
    PrivateUse1 backend, measured like CUDA through ``torch.accelerator`` (`memviz.hardware.accelerator`)."""
    if importlib.util.find_spec("torch_neuronx") is None:
        raise DeviceUnavailable("device 'neuron' needs torch_neuronx (AWS Neuron SDK), which is not "
                                "installed here; profile with device='fake:trn1' / 'fake:trn2' / "
                                "'fake:inf2' for an estimate")
    importlib.import_module("torch_neuronx")
    current = torch.accelerator.current_accelerator()
    if current is None or current.type != "neuron" or torch.accelerator.device_count() == 0:
        raise DeviceUnavailable("torch_neuronx is installed but torch.accelerator sees no neuron device "
                                f"(current accelerator: {current}); run on a Trainium instance or use "
                                "device='fake:trn2' for an estimate")
    dev = torch.device("neuron", accelerator.index(device))
    _, total = accelerator.memory_info(dev)
    return DeviceInfo(f"neuron:{dev.index}", False, total, dev)


# --- free memory and the roofline of a real device ----------------------------------------------------
def _meminfo_available(path: str = "/proc/meminfo") -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (what the kernel can give without swapping)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory(info: DeviceInfo) -> int | None:
    """Bytes a profile could still allocate on `info`'s device; None when unknown (or estimated).

    CPU: ``MemAvailable`` (Linux), else free physical pages.  CUDA: the driver's free memory plus what
    PyTorch's caching allocator holds reserved but unused (it reuses those blocks first)."""
    if info.estimated:
        return None
    dev = info.torch_device
    if dev.type == "xla":
        from memviz.hardware import xla

        return xla.available_bytes(dev)
    if accelerator.is_accelerator(dev):
        return accelerator.available_bytes(dev)
    if dev.type == "cpu":
        found = _meminfo_available()
        if found is not None:
            return found
        try:
            import os

            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            return None
    return None


def estimated_on(info: DeviceInfo) -> DeviceInfo:
    """`info` turned into an estimate for the same device: its name and capacity, the roofline of the
    matching named target (CPU: ``cpu``; a CUDA GPU: the target whose name its product name contains,
    A100s told apart by memory, else the A100 80 GB as a stated stand-in; Neuron: the Trainium2 chip;
    an XLA device: the target that shares its graph time)."""
    if info.target is not None:
        target = info.target
    elif info.torch_device.type == "cuda":
        product = info.name.lower()
        candidates = [t for key, t in TARGETS.items() if key.split("-")[0] in product and key != "cpu"]
        if len(candidates) > 1 and info.capacity_bytes:
            candidates.sort(key=lambda t: abs(t.capacity_bytes - info.capacity_bytes))
        target = candidates[0] if candidates else TARGETS["a100-80gb"]
    elif info.torch_device.type == "neuron":
        target = TARGETS["trn2"]
    else:
        target = TARGETS["cpu"]
    return DeviceInfo(info.name, True, info.capacity_bytes, info.torch_device, target)


# --- FLOP counting ----------------------------------------------------------------------------------
def _register_cpu_sdpa_flops() -> None:
    """FlopCounterMode counts 0 for CPU attention kernels (TOOLCHAIN.md): give them the GPU formulas."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    fwd = aten._scaled_dot_product_flash_attention_for_cpu
    bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if fwd in fc.flop_registry:
        return

    @fc.register_flop_formula(fwd, get_raw=True)
    def _fwd(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return fc.sdpa_flop_count(query.shape, key.shape, value.shape)

    @fc.register_flop_formula(bwd, get_raw=True)
    def _bwd(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None,
             **kwargs: Any) -> int:
        return fc.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


_register_cpu_sdpa_flops()


def count_flops(fn: Any) -> tuple[float, Any]:
    """FLOPs of running `fn()` (FlopCounterMode) and its result."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = fn()
    return float(counter.get_total_flops()), out
