"""AWS Neuron (Trainium / Inferentia) memory readers and the checkpointing warning.

Two public sources of device memory on a Neuron machine:

* ``neuron-monitor``'s JSON reports (Neuron Monitor User Guide, "memory_used" and
  "neuron_hardware_info"): per application, ``report.memory_used.neuron_runtime_used_bytes`` holds
  ``host`` and ``neuron_device`` totals and a ``usage_breakdown`` with ``host`` categories and
  ``neuroncore_memory_usage`` per NeuronCore (constants, model_code, model_shared_scratchpad,
  runtime_memory, tensors); ``memory_used.loaded_models`` what each compiled model (NEFF) took at
  load time.  The tool streams one complete JSON report per line.
* the driver's sysfs counters (Neuron Sysfs User Guide):
  ``/sys/devices/virtual/neuron_device/neuron<D>/neuron_core<C>/stats/memory_usage/device_mem/``
  holds ``total`` / ``present`` / ``peak`` files and one directory per category with the same three
  files; ``neuron<D>/stats/memory_usage/host_mem/<category>/`` the host side.  For memory counters
  ``total`` is the current usage, ``present`` the size of the last allocation or free and ``peak``
  the maximum since the driver loaded (or since a write cleared it).

The readers only parse; nothing here needs the Neuron SDK.  The live backend (`live_memory`) is on
only when ``torch_neuronx`` is importable.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shlex
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

SYSFS_ROOT = Path("/sys/devices/virtual/neuron_device")

NEURON_CHECKPOINT_WARNING = (
    "Neuron target: the Neuron compiler (neuronx-cc) can undo activation checkpointing. Its default "
    "optimizations may fold the recomputed forward ops back into the original ones, so the activations "
    "a rematerialization plan frees stay resident and the planned peak is not reached on the device. "
    'Compile with NEURON_CC_FLAGS="-O1" (set it in the environment before the first compilation, e.g. '
    "os.environ['NEURON_CC_FLAGS'] = '-O1') to keep the recomputation, and check the device peak with "
    "neuron-monitor or the sysfs counters (memviz.hardware.neuron.read_sysfs)."
)


class NeuronFormatError(ValueError):
    """A neuron-monitor report or a sysfs tree does not have the documented layout."""


class NeuronUnavailable(RuntimeError):
    """The live Neuron backend was asked for on a machine without the Neuron SDK."""


class NeuronCheckpointWarning(UserWarning):
    """Rematerialization on a Neuron target may be undone by the compiler (see NEURON_CHECKPOINT_WARNING)."""


# --- data --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CoreMemory:
    """Device memory of one NeuronCore: current bytes by category and, where the source has it, the peak.

    ``device`` is the Neuron device index when known (sysfs; neuron-monitor numbers cores globally).
    """

    core: int
    used_bytes: int
    breakdown: dict[str, int] = field(default_factory=dict)
    peak_bytes: int | None = None
    peak_breakdown: dict[str, int] = field(default_factory=dict)
    device: int | None = None


@dataclass(frozen=True)
class NeuronHardware:
    """``neuron_hardware_info`` of a neuron-monitor report."""

    device_type: str
    device_count: int
    device_memory_bytes: int
    cores_per_device: int
    core_version: str = ""
    device_version: str = ""
    logical_core_config: int | None = None

    @property
    def core_memory_bytes(self) -> int:
        """Device memory per NeuronCore (each core of a device shares its HBM equally)."""
        return self.device_memory_bytes // self.cores_per_device


@dataclass(frozen=True)
class LoadedModel:
    """One compiled model (NEFF) of ``memory_used.loaded_models``, its subgraphs summed.

    ``device_breakdown`` is what the runtime allocated for it at load time (constants, model_code,
    runtime_memory, tensors); ``cores`` the NeuronCores its subgraphs are loaded on.
    """

    name: str
    model_id: int
    is_running: bool
    host_bytes: int
    device_bytes: int
    device_breakdown: dict[str, int]
    cores: tuple[int, ...]


@dataclass(frozen=True)
class RuntimeMemory:
    """``memory_used`` of one Neuron application (one entry of ``neuron_runtime_data``)."""

    pid: int
    tag: str
    host_bytes: int
    device_bytes: int
    host_breakdown: dict[str, int]
    cores: tuple[CoreMemory, ...]
    error: str = ""
    models: tuple[LoadedModel, ...] = ()


@dataclass(frozen=True)
class MonitorReport:
    """One neuron-monitor report: every monitored application's memory and the hardware, if reported."""

    runtimes: tuple[RuntimeMemory, ...]
    hardware: NeuronHardware | None = None
    errors: tuple[str, ...] = ()

    @property
    def device_bytes(self) -> int:
        """Device memory used by all monitored applications together."""
        return sum(r.device_bytes for r in self.runtimes)

    @property
    def host_bytes(self) -> int:
        return sum(r.host_bytes for r in self.runtimes)

    def core_bytes(self) -> dict[int, int]:
        """Device bytes per NeuronCore index, summed over applications."""
        out: dict[int, int] = {}
        for r in self.runtimes:
            for c in r.cores:
                out[c.core] = out.get(c.core, 0) + c.used_bytes
        return dict(sorted(out.items()))


@dataclass(frozen=True)
class SysfsSnapshot:
    """The sysfs memory counters of every Neuron device under one root."""

    cores: tuple[CoreMemory, ...]
    host: dict[int, dict[str, int]]  # device -> host_mem category -> current bytes
    core_counts: dict[int, int]
    arch: dict[int, str]

    @property
    def device_bytes(self) -> int:
        return sum(c.used_bytes for c in self.cores)

    @property
    def peak_bytes(self) -> int | None:
        """Largest per-core peak (the number to compare with one core's plan); None when not reported."""
        peaks = [c.peak_bytes for c in self.cores if c.peak_bytes is not None]
        return max(peaks) if peaks else None


# --- neuron-monitor -----------------------------------------------------------------------------------
def parse_monitor_report(report: Mapping[str, Any]) -> MonitorReport:
    """Parse one neuron-monitor JSON report (already decoded) into a `MonitorReport`.

    Applications whose ``report`` lacks ``memory_used`` (metric group disabled) or that carry an
    ``error`` are listed in ``errors``, not silently dropped.
    """
    if not isinstance(report, Mapping) or "neuron_runtime_data" not in report:
        raise NeuronFormatError(
            "not a neuron-monitor report: the top-level object has no 'neuron_runtime_data' list "
            "(pass the JSON that `neuron-monitor` prints, one report per line)"
        )
    entries = report["neuron_runtime_data"]
    if not isinstance(entries, list):
        raise NeuronFormatError("neuron-monitor report: 'neuron_runtime_data' must be a list")
    runtimes, errors = [], []
    for i, entry in enumerate(entries):
        where = f"neuron_runtime_data[{i}]"
        entry = _mapping(entry, where)
        tag = str(entry.get("neuron_runtime_tag", entry.get("pid", i)))
        memory = _mapping(entry.get("report", {}), f"{where}.report").get("memory_used")
        error = str(entry.get("error") or "")
        if memory is None:
            errors.append(f"{tag}: {error or 'no memory_used metric group in this report'}")
            continue
        memory = _mapping(memory, f"{where}.report.memory_used")
        if memory.get("error"):
            error = error or str(memory["error"])
        runtimes.append(_parse_runtime(entry, memory, tag, error, where))
        if error:
            errors.append(f"{tag}: {error}")
    hardware = report.get("neuron_hardware_info")
    return MonitorReport(
        tuple(runtimes), _parse_hardware(hardware) if hardware is not None else None, tuple(errors)
    )


def _parse_runtime(entry: Mapping[str, Any], memory: Mapping[str, Any], tag: str, error: str,
                   where: str) -> RuntimeMemory:
    models = _parse_models(memory.get("loaded_models", []), f"{where}.report.memory_used")
    where = f"{where}.report.memory_used.neuron_runtime_used_bytes"
    used = _mapping(memory.get("neuron_runtime_used_bytes"), where)
    breakdown = _mapping(used.get("usage_breakdown", {}), f"{where}.usage_breakdown")
    host = _int_map(breakdown.get("host", {}), f"{where}.usage_breakdown.host")
    per_core_where = f"{where}.usage_breakdown.neuroncore_memory_usage"
    per_core = _mapping(breakdown.get("neuroncore_memory_usage", {}), per_core_where)
    cores = []
    for key, cats in per_core.items():
        if not str(key).isdigit():
            raise NeuronFormatError(f"{where}: NeuronCore index {key!r} is not a number")
        cats = _int_map(cats, f"{per_core_where}[{key}]")
        cores.append(CoreMemory(core=int(key), used_bytes=sum(cats.values()), breakdown=cats))
    return RuntimeMemory(
        pid=_int(entry.get("pid", 0), f"{where}.pid"),
        tag=tag,
        host_bytes=_int(used.get("host"), f"{where}.host"),
        device_bytes=_int(used.get("neuron_device"), f"{where}.neuron_device"),
        host_breakdown=host,
        cores=tuple(sorted(cores, key=lambda c: c.core)),
        error=error,
        models=tuple(models),
    )


def _parse_models(models: Any, where: str) -> list[LoadedModel]:
    if not isinstance(models, list):
        raise NeuronFormatError(f"neuron-monitor report: {where}.loaded_models must be a list")
    out = []
    for i, m in enumerate(models):
        w = f"{where}.loaded_models[{i}]"
        m = _mapping(m, w)
        host = device = 0
        breakdown: dict[str, int] = {}
        cores = set()
        for name, sg in _mapping(m.get("subgraphs", {}), f"{w}.subgraphs").items():
            sw = f"{w}.subgraphs.{name}"
            sg = _mapping(sg, sw)
            used = _mapping(sg.get("memory_used_bytes"), f"{sw}.memory_used_bytes")
            host += _int(used.get("host"), f"{sw}.memory_used_bytes.host")
            device += _int(used.get("neuron_device"), f"{sw}.memory_used_bytes.neuron_device")
            parts = _mapping(used.get("usage_breakdown", {}), f"{sw}.memory_used_bytes.usage_breakdown")
            dev_parts = _int_map(parts.get("neuron_device", {}), f"{sw}.usage_breakdown.neuron_device")
            for cat, v in dev_parts.items():
                breakdown[cat] = breakdown.get(cat, 0) + v
            if "neuroncore_index" in sg:
                cores.add(_int(sg["neuroncore_index"], f"{sw}.neuroncore_index"))
        out.append(LoadedModel(
            name=str(m.get("name", "")),
            model_id=_int(m.get("model_id", 0), f"{w}.model_id"),
            is_running=bool(m.get("is_running", False)),
            host_bytes=host,
            device_bytes=device,
            device_breakdown=breakdown,
            cores=tuple(sorted(cores)),
        ))
    return out


def _parse_hardware(info: Any) -> NeuronHardware | None:
    info = _mapping(info, "neuron_hardware_info")
    if info.get("error"):
        return None  # the driver is not loaded: the report says so and has no numbers
    where = "neuron_hardware_info"
    logical = info.get("logical_neuroncore_config")
    return NeuronHardware(
        device_type=str(info.get("neuron_device_type", "")),
        device_count=_int(info.get("neuron_device_count"), f"{where}.neuron_device_count"),
        device_memory_bytes=_int(info.get("neuron_device_memory_size"), f"{where}.neuron_device_memory_size"),
        cores_per_device=_int(
            info.get("neuroncore_per_device_count"), f"{where}.neuroncore_per_device_count"
        ),
        core_version=str(info.get("neuroncore_version", "")),
        device_version=str(info.get("neuron_device_version", "")),
        logical_core_config=(
            None if logical is None else _int(logical, f"{where}.logical_neuroncore_config")
        ),
    )


def load_monitor_report(path: str | os.PathLike[str]) -> MonitorReport:
    """Read one neuron-monitor report saved as a JSON document (pretty-printed or one line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"neuron-monitor report {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        obj = _decode(text)
    except json.JSONDecodeError as e:
        raise NeuronFormatError(
            f"{path} is not one JSON document ({e.msg} at line {e.lineno}); for a captured stream with one "
            "report per line use read_monitor_stream"
        ) from None
    return parse_monitor_report(obj)


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:  # hostile nesting: no real report is more than a few levels deep
        raise NeuronFormatError("neuron-monitor report nests too deeply to be a real report") from None


def read_monitor_stream(source: str | os.PathLike[str] | Iterable[str]) -> list[MonitorReport]:
    """Read captured neuron-monitor output (a file path, or its lines): one JSON report per line."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(
                f"neuron-monitor output {path} does not exist (save it with `neuron-monitor > file`)"
            )
        lines: Iterable[str] = path.read_text(encoding="utf-8").splitlines()
    else:
        lines = source
    reports = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = _decode(line)
        except json.JSONDecodeError as e:
            raise NeuronFormatError(
                f"neuron-monitor output line {n} is not JSON ({e.msg} at column {e.colno}); the tool writes "
                "one complete report per line, so a truncated last line means the capture was cut off"
            ) from None
        reports.append(parse_monitor_report(obj))
    if not reports:
        raise NeuronFormatError("neuron-monitor output holds no report")
    return reports


def peak_device_bytes(reports: Iterable[MonitorReport]) -> int:
    """Largest total device memory over a stream of reports (sampled: a peak between samples is missed)."""
    return max(r.device_bytes for r in reports)


# --- sysfs --------------------------------------------------------------------------------------------
_DEVICE_DIR = re.compile(r"neuron(\d+)$")
_CORE_DIR = re.compile(r"neuron_core(\d+)$")


def read_sysfs(root: str | os.PathLike[str] = SYSFS_ROOT) -> SysfsSnapshot:
    """Read every device's and NeuronCore's memory counters under ``root`` (the driver's sysfs tree).

    A core's current usage is ``device_mem/total`` when the aggregate counter exists, else the sum of
    its categories; its peak is ``device_mem/peak`` (None when only per-category peaks exist, since
    their sum over-states the joint peak).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root} does not exist: no Neuron driver here (the counters appear on trn/inf instances "
            "with aws-neuronx-dkms loaded)"
        )
    cores, host, core_counts, arch = [], {}, {}, {}
    devices = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _DEVICE_DIR.match(p.name)))
    if not devices:
        raise NeuronFormatError(f"{root} holds no neuron<N> device directory")
    for dev, dev_path in devices:
        if (dev_path / "core_count").is_file():
            core_counts[dev] = _read_counter(dev_path / "core_count")
        arch_file = dev_path / "info" / "architecture" / "arch_type"
        if arch_file.is_file():
            arch[dev] = arch_file.read_text(encoding="utf-8").strip()
        host_dir = dev_path / "stats" / "memory_usage" / "host_mem"
        if host_dir.is_dir():
            host[dev] = {c: v["total"] for c, v in _categories(host_dir).items() if "total" in v}
        for core_path in sorted(dev_path.iterdir(), key=lambda p: p.name):
            if (m := _CORE_DIR.match(core_path.name)) is None:
                continue
            mem_dir = core_path / "stats" / "memory_usage" / "device_mem"
            if not mem_dir.is_dir():
                raise NeuronFormatError(f"{core_path} has no stats/memory_usage/device_mem directory")
            cats = _categories(mem_dir)
            current = {c: v["total"] for c, v in cats.items() if "total" in v}
            peaks = {c: v["peak"] for c, v in cats.items() if "peak" in v}
            aggregate = _counter_files(mem_dir)
            if not aggregate and not current:
                raise NeuronFormatError(
                    f"{mem_dir} holds neither total/peak counters nor category directories"
                )
            cores.append(CoreMemory(
                core=int(m.group(1)),
                used_bytes=aggregate.get("total", sum(current.values())),
                breakdown=current,
                peak_bytes=aggregate.get("peak"),
                peak_breakdown=peaks,
                device=dev,
            ))
    return SysfsSnapshot(tuple(cores), host, core_counts, arch)


def _categories(directory: Path) -> dict[str, dict[str, int]]:
    return {p.name: _counter_files(p) for p in sorted(directory.iterdir()) if p.is_dir()}


def _counter_files(directory: Path) -> dict[str, int]:
    names = ("total", "present", "peak")
    return {n: _read_counter(directory / n) for n in names if (directory / n).is_file()}


def _read_counter(path: Path) -> int:
    text = path.read_text(encoding="utf-8").strip()
    try:
        return int(text)
    except ValueError:
        raise NeuronFormatError(f"{path}: expected an integer counter, found {text[:40]!r}") from None


# --- live backend ---------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def neuron_available() -> bool:
    """True when ``torch_neuronx`` (the Neuron SDK's PyTorch plugin) imports; the live backend needs it."""
    if importlib.util.find_spec("torch_neuronx") is None:
        return False
    try:
        importlib.import_module("torch_neuronx")
    except Exception:  # a broken SDK install must switch the backend off, not crash profiling
        return False
    return True


def live_memory(root: str | os.PathLike[str] = SYSFS_ROOT) -> SysfsSnapshot:
    """The attached Neuron devices' memory counters right now (`read_sysfs` of the live tree)."""
    if not neuron_available():
        raise NeuronUnavailable(
            "the live Neuron backend needs torch_neuronx, which is not importable here: run on a trn/inf "
            "instance with the Neuron SDK (torch-neuronx), or profile with device='fake:trn1' (estimated)"
        )
    return read_sysfs(root)


# --- the checkpointing warning ----------------------------------------------------------------------------
_NEURON_NAME = re.compile(r"(neuron|trn\d*n?|trainium\d*|inf\d+|inferentia\d*)")


def is_neuron_target(device: object) -> bool:
    """Whether a device spec names Neuron hardware: ``neuron``, ``neuron:0``, ``fake:trn1``, ``trn2``,
    ``inf2``, ``trainium``...; ``xla`` counts only when the Neuron SDK is present (its legacy device)."""
    name = str(getattr(device, "type", device)).strip().lower()
    if name.startswith("fake:"):
        name = name[len("fake:"):]
    name = name.split(":", 1)[0]
    if name == "xla":
        return neuron_available()
    return _NEURON_NAME.fullmatch(name) is not None


def compiled_with_o1(flags: str) -> bool:
    """Whether a NEURON_CC_FLAGS string selects optimization level 1 (``-O1``, ``--optlevel 1``/``=1``)."""
    level = None
    tokens = shlex.split(flags)
    for i, tok in enumerate(tokens):
        if re.fullmatch(r"-O\d", tok):
            level = tok[2:]
        elif tok.startswith("--optlevel="):
            level = tok.split("=", 1)[1]
        elif tok in ("--optlevel", "-O") and i + 1 < len(tokens):
            level = tokens[i + 1]
    return level == "1"  # the last setting wins, as on a command line


def warn_neuron_checkpointing(
    device: object, env: Mapping[str, str] | None = None, *, stacklevel: int = 2
) -> bool:
    """Emit `NEURON_CHECKPOINT_WARNING` (a visible `NeuronCheckpointWarning`) for a Neuron target.

    Silent for other devices and when ``NEURON_CC_FLAGS`` already selects ``-O1``.  Returns whether it
    warned.  `memviz.plan` calls it for every plan that recomputes; ``stacklevel`` as in
    `warnings.warn` (2: the line that called this function).
    """
    if not is_neuron_target(device):
        return False
    flags = (os.environ if env is None else env).get("NEURON_CC_FLAGS", "")
    if compiled_with_o1(flags):
        return False
    warnings.warn(NEURON_CHECKPOINT_WARNING, NeuronCheckpointWarning, stacklevel=stacklevel)
    return True


# --- small validators -------------------------------------------------------------------------------------
def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise NeuronFormatError(
            f"neuron-monitor report: {where} must be an object, got {type(value).__name__}"
        )
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NeuronFormatError(
            f"neuron-monitor report: {where} must be a non-negative integer, got {value!r}"
        )
    return value


def _int_map(value: Any, where: str) -> dict[str, int]:
    return {str(k): _int(v, f"{where}.{k}") for k, v in _mapping(value, where).items()}
