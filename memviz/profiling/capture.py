"""Capture an nn.Module as a CD-graph: torch.export -> AOT joint graph -> `solvers.Graph`.

The joint graph (forward + backward, functionalized: in-place ops rewritten out of place, BatchNorm
running-stat updates turned into extra outputs) is split into the two kinds of CD-graph nodes of
Rockmate (Sec. 3.2, Appendix A) and Checkmate (Sec. 4.1):

* one *compute node* per FX operator node that creates a new storage;
* one *data node* per storage.  View/alias nodes (view, permute, t, expand, unbind, detach,
  ``_unsafe_view`` ...) create no storage: they are merged into the data node of the storage they alias
  and replayed on demand by the executor (`run_compute`), which is cheap and allocates nothing.

Aliasing is read from the fake tensors in ``node.meta["val"]`` (views share their base's fake
storage), so every view op is recognised, including ones no list names.  Byte sizes are the storage's
exact ``nbytes``.

The user's loss is not traced into the joint graph: the exported module must give the gradients of
whatever loss the user computes.  The graph instead carries two synthetic compute nodes, ``loss``
(forward) and ``loss_backward`` (backward) that consume the model outputs and produce the output
gradients (``tangents``), with the byte sizes the profiled ``loss_fn`` really produces (``sum`` gives
an expanded scalar: a few bytes, as in eager PyTorch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import inspect
import operator
import re
import sys
import unittest.mock
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from memviz.hardware import accelerator
from solvers import DataKind, DataNode, Graph, GraphBuilder, Phase, with_order_chain

LossFn = Callable[[Any], torch.Tensor]


class CaptureError(RuntimeError):
    """torch.export or the AOT joint trace could not capture the model.

    `module` and `source` name the module path and source line where tracing stopped, when known."""

    def __init__(self, message: str, module: str = "", source: str = "") -> None:
        self.module = module
        self.source = source
        where = ""
        if module or source:
            where = f" (in module {module or '?'} at {source or '?'})"
        super().__init__(f"{message}{where}")


class StalePlanError(ValueError):
    """The plan does not belong to this model or these inputs (changed since profiling)."""


def default_loss(output: Any) -> torch.Tensor:
    """The loss memviz differentiates when none is given: the sum of every floating tensor in the
    output (tuples, lists and dicts included), each summed in its own dtype except float16/bfloat16,
    which are summed in float32 so the reduction cannot overflow.  Its backward is an expanded scalar
    per output, like ``out.sum().backward()`` in eager PyTorch."""
    total: torch.Tensor | None = None
    for leaf in pytree.tree_leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad:
            s = leaf.float().sum() if leaf.dtype in (torch.float16, torch.bfloat16) else leaf.sum()
            total = s if total is None else total + s
    if total is None:
        raise CaptureError("the model output has no floating-point tensor that requires grad: "
                           "pass loss_fn= or profile with mode='inference'")
    return total


# --- what the exporter and the profiler need to replay the graph ---------------------------------
@dataclass
class Captured:
    """The captured joint graph and how its FX nodes map to the CD-graph.

    ``placeholders[i]`` says what the i-th FX placeholder is: ``("param", fqn)``, ``("buffer", fqn)``,
    ``("input", flat_index)`` or ``("tangent", flat_output_index)``.  ``outputs[i]`` says what the i-th
    FX output is: ``("user", flat_index)``, ``("grad", fqn)``, ``("input_grad", flat_index)``,
    ``("buffer", fqn)`` (new value of a
    mutated buffer, copied back once per step) or ``None``.
    """

    gm: torch.fx.GraphModule
    mode: str
    placeholders: list[tuple[str, Any]]
    outputs: list[tuple[str, Any] | None]
    compute_fx: list[str | None]  # compute id -> FX node it runs (None: synthetic loss nodes)
    data_fx: list[str | None]  # data id -> FX node whose value is (a tensor on) that storage
    data_of_fx: dict[str, int]  # FX node (tensor-valued) -> data id of its storage
    out_spec: pytree.TreeSpec  # structure of the model's output
    in_spec: pytree.TreeSpec  # structure of (args, kwargs)
    input_meta: list[tuple[tuple[int, ...], torch.dtype] | None]  # flat user inputs (None: not a tensor)
    # flat input index -> the first index the call passed the same tensor at (``model(ids, labels=ids)``):
    # the graph's aliases follow the call's, so a trace again on fresh inputs passes one tensor there too
    input_shared: dict[int, int] = field(default_factory=dict)
    tangent_data: dict[int, int] = field(default_factory=dict)  # flat output index -> data id
    loss_compute: int | None = None
    loss_backward_compute: int | None = None
    param_names: dict[str, str] = field(default_factory=dict)  # alias fqn -> canonical fqn (tied)
    elem_fx: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # multi-output op -> getitems
    grad_data: dict[str, int] = field(default_factory=dict)  # canonical parameter fqn -> its gradient
    input_grad_data: dict[int, int] = field(default_factory=dict)  # flat input index -> its gradient
    # flat input index -> a non-tensor input's value: the trace specialised the graph on it
    input_consts: dict[int, Any] = field(default_factory=dict)
    tangent_fx: dict[int, str] = field(default_factory=dict)  # flat output index -> its gradient's FX input
    held_fx: dict[int, tuple[str, ...]] = field(default_factory=dict)  # data id -> more FX values it holds
    output_data: dict[int, int] = field(default_factory=dict)  # flat output index -> data id the loss reads
    # flat output index -> (its base, the FX view ops from the base to it): an output that aliases another
    # output, an input, a parameter or a buffer, regenerated outside the joint graph (`OutputView`)
    output_views: dict[int, OutputView] = field(default_factory=dict)
    # `loss_memory` bound to this capture's outputs (``real=True`` measures it on the device); None
    # without a loss.  The loss's data nodes: loss, loss_saved (when it saves anything), loss_grad
    loss_probe: Callable[..., LossMemory] | None = field(default=None, repr=False)
    # FX get_attr node -> the graph module attribute it reads: a tensor constant of the trace
    # (``torch.tensor`` in the model's code, lifted by torch.export), bound like a buffer by every runner
    constants: dict[str, str] = field(default_factory=dict)
    # ("grad", canonical fqn) / ("input_grad", flat index) -> the FX output node of that gradient
    grad_fx: dict[tuple[str, Any], str] = field(default_factory=dict)
    # what the trace specialised on the example input's values ("file:line expr -> value"), `specialising`
    specialised: list[str] = field(default_factory=list)
    # the places among them that read a uniform draw (LayerDrop's ``torch.rand([]) < p``), taken as the draw
    # at its top gives them: every such layer runs (`draws_at_their_top`)
    drawn: list[str] = field(default_factory=list)
    # random generators outside torch the trace drew from (`host_random_draws`): their draws are constants
    host_random: list[str] = field(default_factory=list)
    # (eager's draws, the graph's) from torch's generators per forward where they differ
    # (`traced_as_eager_draws`): the exported step's dropout masks cannot be eager's; None: equal
    torch_draws: tuple[int, int] | None = None
    # FX values the model keeps across calls (`kept_values`) and outputs only reference cycles hold
    # (`kept_across_calls`): the eager graph holds them to the step's end
    kept_fx: tuple[str, ...] = ()
    # whose kernels the trace took (`kernel_family`): "cuda" for a CUDA target estimated on a CPU host
    kernels: str | None = None
    # FX value -> the FX placeholder operators read instead: a mutated buffer's new value, once written
    # back into the buffer, is read from the buffer itself, as in eager, where BatchNorm updates its
    # statistics in place and its backward reads them (`written_back`)
    reads_instead: dict[str, str] = field(default_factory=dict)
    # compute id of a gradient sum run in place -> which of its two FX arguments it writes
    # (`accumulate_in_place`; the graph marks the written data node in `ComputeNode.mutates`)
    accumulates: dict[int, int] = field(default_factory=dict)
    # checkpointable block (`block_paths`) -> the FX values of the tensors its call gets (`call_arguments`):
    # non-reentrant checkpointing keeps every argument of the call, read by the block's ops or not
    call_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # the caller's torch.autocast regions around the capture (`accelerator.autocast_regions`): the graph
    # holds their casts, and memviz runs the step's forward, loss and backward inside them again
    # (`accelerator.autocast_as`), the optimizer's update outside
    autocast: tuple[tuple[str, torch.dtype], ...] = ()
    # those regions cache their casts: eager keeps the forward's down-cast parameters to the backward's end
    autocast_cached: bool = False

    @property
    def nodes(self) -> dict[str, torch.fx.Node]:
        return {n.name: n for n in self.gm.graph.nodes}

    @property
    def compute_fx_set(self) -> frozenset[str]:
        return frozenset(c for c in self.compute_fx if c is not None)

    def placeholder_values(self, model: nn.Module, flat_inputs: Sequence[Any]) -> dict[str, torch.Tensor]:
        """FX placeholder name -> the model's own parameter/buffer or the user's input (no tangents)."""
        params = dict(model.named_parameters(remove_duplicate=False))
        buffers = dict(model.named_buffers(remove_duplicate=False))
        values: dict[str, torch.Tensor] = {}
        placeholders = self.gm.graph.find_nodes(op="placeholder")
        for n, (kind, key) in zip(placeholders, self.placeholders, strict=True):
            if kind == "param":
                values[n.name] = params[key]
            elif kind == "buffer":
                values[n.name] = buffers[key]
            elif kind == "input":
                values[n.name] = flat_inputs[key]
        values.update(constant_values(self.gm, self.constants))
        return values


def constant_values(gm: torch.fx.GraphModule, constants: dict[str, str]) -> dict[str, torch.Tensor]:
    """FX get_attr node name -> the tensor constant the graph module holds under that attribute."""
    return {name: _attr(gm, target) for name, target in constants.items()}


def _attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _tensor_leaves(val: Any) -> list[torch.Tensor | None]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [v if isinstance(v, torch.Tensor) else None for v in val]
    return []


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def storage_nbytes(t: torch.Tensor) -> int:
    return int(t.untyped_storage().nbytes())


#: scatters whose kernel copies the whole storage of the view it writes into (ATen's
#: ``clone_preserve_strides``), keeping the view's strides and offset; their fake kernels allocate only
#: the view's extent, so the output's bytes are the input's storage's (Swin's shifted-window mask, built
#: by slice assignment: 128 B per scatter of an 8 x 8 mask, one export measured over its plan by that)
STORAGE_CLONING_SCATTERS = frozenset({torch.ops.aten.slice_scatter.default,
                                      torch.ops.aten.select_scatter.default,
                                      torch.ops.aten.diagonal_scatter.default})


def _module_of(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return str(path)


def module_classes(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Module path -> the qualified name of its class, for every module an op of `gm` ran in (FX's
    ``nn_module_stack``: per op, each enclosing module's path and class).  One entry per module rather
    than per op: the views name a block by its class ("12 x GPT2Block"), and a plan file stays small."""
    classes: dict[str, str] = {}
    for n in gm.graph.nodes:
        stack = n.meta.get("nn_module_stack") or n.meta.get("fwd_nn_module_stack") or {}
        for path, cls in stack.values():
            # a class object under dynamo, its qualified name under export
            name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
            classes.setdefault(str(path), name)
    return classes


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>.*)')


_TORCH_DIR = str(Path(torch.__file__).parent)


def source_of(node: torch.fx.Node) -> str:
    """``file:line in fn: code`` of the innermost frame outside torch itself (the user's line)."""
    trace = node.meta.get("stack_trace") or ""
    frames = list(_FRAME.finditer(trace))
    if not frames:
        return ""
    user = [f for f in frames if not f["file"].startswith(_TORCH_DIR)]
    f = (user or frames)[-1]
    return f"{f['file']}:{f['line']} in {f['fn']}: {f['code'].strip()}"


def is_backward(node: torch.fx.Node) -> bool:
    """Whether the AOT joint graph traced `node` for the backward pass."""
    return node.meta.get("partitioner_tag") == "is_backward" or bool(node.meta.get("autograd_backward"))


def origin_source(node: Any) -> Any:
    """The first record of FX `node`'s provenance (each pass adds one in front): the node the user's code
    made in the exported program; None without provenance."""
    sources = node.meta.get("from_node")
    if not sources:
        return None
    source = sources[0]
    while source.from_node:
        source = source.from_node[0]
    return source


def origin_op(node: Any) -> str | None:
    """The operator the user's code ran for FX `node`: the target of `origin_source`, e.g.
    'aten.hardswish_.default'; None without provenance."""
    source = origin_source(node)
    return None if source is None else str(source.target)


def in_place_op(node: Any) -> Any:
    """The in-place ATen overload the user's code ran for FX `node` (`origin_op`: ``aten.relu_.default``
    for a functional ``aten.relu.default``), or None where it ran none."""
    origin = origin_op(node)
    if origin is None or not is_in_place(origin):
        return None
    parts = origin.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    packet = getattr(torch.ops.aten, parts[1], None)
    return getattr(packet, parts[2], None) if packet is not None else None


def is_in_place(op: str) -> bool:
    """'aten.relu_.default' -> True."""
    parts = op.split(".")
    base = parts[1] if len(parts) >= 3 else parts[0]
    return base.endswith("_") and not base.endswith("__")


def forward_calls(gm: torch.fx.GraphModule) -> Iterator[torch.fx.Node]:
    """The joint graph's operator calls up to its first backward node: the forward, in trace order."""
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if is_backward(n):
            return
        yield n


def _phase_of(node: torch.fx.Node) -> Phase:
    return Phase.BACKWARD if is_backward(node) else Phase.FORWARD


def _op_name(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t._schema.name.replace('::', '.')}.{t._overloadname}"
    return getattr(t, "__name__", str(t))


def _describe_trace_error(err: BaseException, model: nn.Module) -> CaptureError:
    """Turn a torch.export failure into a CaptureError naming the user's module and line."""
    msg = str(err)
    # torch.export reports the user frame as 'File "x.py", line N, in fn' in its message
    frames = [f for f in _FRAME.finditer(msg) if "site-packages/torch" not in f["file"]]
    source = f"{frames[-1]['file']}:{frames[-1]['line']}" if frames else ""
    if not source:
        m = re.search(r"([\w/\\.-]+\.py):(\d+)", msg)
        source = f"{m.group(1)}:{m.group(2)}" if m else _raising_user_frame(err)
    module = ""
    if source:
        file, line = source.rsplit(":", 1)
        module = _module_defined_at(model, file, int(line))
    first = msg.strip().splitlines()[0] if msg.strip() else type(err).__name__
    return CaptureError(f"could not trace {type(model).__name__}: {type(err).__name__}: {first}",
                        module, source)


def _raising_user_frame(err: BaseException) -> str:
    """``file:line`` of the innermost frame of the traceback outside torch, memviz and the standard
    library: where the user's code called what failed (``.numpy()`` on a traced tensor)."""
    import traceback

    here, stdlib = str(Path(__file__).parents[1]), str(Path(contextlib.__file__).parent)
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith((_TORCH_DIR, here, stdlib))]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _module_defined_at(model: nn.Module, file: str, line: int) -> str:
    """The path of the first submodule whose forward is defined in `file` around `line`."""
    best = ""
    for name, mod in model.named_modules():
        fwd = type(mod).forward
        try:
            src_file = inspect.getsourcefile(fwd) or ""
            lines, start = inspect.getsourcelines(fwd)
        except (OSError, TypeError):
            continue
        if src_file.endswith(file.split("/")[-1]) and start <= line < start + len(lines):
            return name or type(model).__name__
    return best


def fingerprint(model: nn.Module, args: Sequence[Any], kwargs: dict[str, Any] | None, mode: str) -> str:
    """Hash of parameter/buffer names, shapes and dtypes, input shapes/dtypes and mode (stale-plan check)."""
    h = hashlib.sha256(mode.encode())
    for name, p in (*model.named_parameters(), *model.named_buffers()):
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
    for leaf in pytree.tree_leaves((tuple(args), kwargs or {})):
        if isinstance(leaf, torch.Tensor):
            h.update(f"T{tuple(leaf.shape)}:{leaf.dtype};".encode())
        else:
            h.update(f"V{leaf!r};".encode())
    return h.hexdigest()[:16]


@torch.library.custom_op("memviz::cpu_dropout", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def cpu_dropout(input: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's CPU ``dropout`` (``_dropout_impl`` in ATen/native/Dropout.cpp), kept as one opaque op.

    Eager CPU draws a float noise tensor of the input's size (``bernoulli_(1 - p)`` then ``div_``) and
    multiplies it in; torch's default decomposition uses ``native_dropout`` (a bool mask: what CUDA runs)
    and functionalization would turn the in-place steps into extra allocations.  Keeping the eager
    kernel sequence inside one op gives the same random stream, the same bits and the same memory
    (output + float noise saved for backward) as eager mode.  Tagged as drawing from the generator, as
    ``native_dropout`` is, so the joint trace's dead-code pass keeps a dropout whose output nothing reads
    (CANINE's sequence classifier leaves its final character encoder unread): eager draws its mask, and
    without it every later mask came from another offset of the stream."""
    noise = torch.empty_like(input).bernoulli_(1 - p)
    noise.div_(1 - p)
    return input * noise, noise


@cpu_dropout.register_fake
def _(input: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input), torch.empty_like(input)


def _cpu_dropout_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    ctx.save_for_backward(output[1])


def _cpu_dropout_backward(ctx: Any, grad: torch.Tensor, grad_noise: torch.Tensor | None) -> tuple[Any, None]:
    (noise,) = ctx.saved_tensors
    return grad * noise, None  # MulBackward0 of eager's ``input * noise``


cpu_dropout.register_autograd(_cpu_dropout_backward, setup_context=_cpu_dropout_setup)


def _eager_cpu_dropout(input: torch.Tensor, p: float, train: bool | None) -> torch.Tensor:
    if not train or p == 0 or input.numel() == 0:
        return input
    if p == 1:
        return input * torch.zeros((), dtype=input.dtype, device=input.device)
    return torch.ops.memviz.cpu_dropout(input, p)[0]


def _on_cpu(args: Sequence[Any], model: nn.Module) -> bool:
    leaves = (*pytree.tree_leaves(tuple(args)), *model.parameters())
    return all(t.device.type in ("cpu", "meta") for t in leaves if isinstance(t, torch.Tensor))


def kernel_family(kernels: str | None, args: Sequence[Any], model: nn.Module) -> str | None:
    """Whose kernels the trace takes: `kernels` where given (``"cuda"`` for a profile estimated for a CUDA
    target on this host), else ``"cpu"`` where every tensor is on the CPU, else None (the tensors' own
    device decides, as it does for a profile on a real CUDA device)."""
    if kernels not in (None, "cpu", "cuda"):
        raise ValueError(f"kernels must be None, 'cpu' or 'cuda', not {kernels!r}")
    return kernels or ("cpu" if _on_cpu(args, model) else None)


def use_eager_kernels(gm: torch.fx.GraphModule, family: str | None) -> None:
    """Rewrite the exported graph so the joint trace runs the kernels eager mode runs on the `family`'s
    device (``aten.dropout`` is composite: it is rewritten before AOTAutograd decomposes it).  Only the
    CPU differs from the trace's own decomposition (``native_dropout``, a bool mask, as CUDA runs it)."""
    if family != "cpu":
        return
    for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.dropout.default):
        n.target = _eager_cpu_dropout
    gm.recompile()


_PY_DECOMP_KEYS = (torch._C.DispatchKey.Autograd, torch._C.DispatchKey.CompositeImplicitAutograd)
# their Python decompositions are what functionalizes the running-statistics updates their schemas do
# not declare: tracing the kernel itself would drop those updates
_UNDECLARED_MUTATION = frozenset({"aten::native_batch_norm", "aten::cudnn_batch_norm"})


def _has_kernel(name: str) -> bool:
    try:
        return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in ("CPU", "CUDA"))
    except RuntimeError:  # an overload the dispatcher does not know (Python-only)
        return False


def _traced_as_decomposition() -> list[tuple[torch._ops.OpOverload, torch._C.DispatchKey]]:
    """(op, key) of the Python decompositions that would replace a kernel eager mode runs.

    The AOT trace runs with the Python dispatcher, where `torch._decomp` registers decompositions for
    some operators that have their own kernels (``upsample_bilinear2d`` into gathers and lerps,
    ``upsample_nearest2d`` into index ops ...) and for the composite overloads that eager forwards to
    those kernels (``upsample_bilinear2d.vec``).  The decomposition rounds differently and allocates
    other intermediates, so the captured graph would neither give eager's bits nor its memory."""
    found = []
    for packet in list(vars(torch.ops.aten).values()):
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        default_kernel = "default" in packet.overloads() and _has_kernel(packet.default.name())
        for overload in packet.overloads():
            op = getattr(packet, overload)
            name = op._schema.name
            if name in _UNDECLARED_MUTATION or op._schema.is_mutable:
                continue
            if _has_kernel(op.name()) or default_kernel:
                found += [(op, k) for k in _PY_DECOMP_KEYS if k in op.py_kernels]
    return found


@contextlib.contextmanager
def eager_kernels_in_trace() -> Any:
    """Trace operators that have kernels as those kernels (see `_traced_as_decomposition`)."""
    removed = [(op, key, op.py_kernels.pop(key)) for op, key in _traced_as_decomposition()]
    for op, _, _ in removed:
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key, fn in removed:
            op.py_kernels[key] = fn
            op._dispatch_cache.clear()


@contextlib.contextmanager
def rnn_decomposed_in_trace(train: bool) -> Iterator[None]:
    """Trace every LSTM of a training step as torch's per-step decomposition.  torch.export decomposes
    ``aten.lstm`` into oneDNN's ``mkldnn_rnn_layer`` where oneDNN is on and the layer's input needs no
    gradient (a first layer on the data), else into a matmul and gates per step.  oneDNN's kernel gives
    its backward a workspace only in grad mode, which the exported step's forward (inside an
    ``autograd.Function``) and the profile's cost replay (``no_grad``) are not in, and its fake kernel
    sizes that workspace 0 bytes: the backward failed on the missing workspace.  The profile warns that
    eager's fused kernels differ from the decomposition (`memviz.profiling.profile.profile`)."""
    if not train:
        yield
        return
    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(enabled)


@contextlib.contextmanager
def eager_cpu_dropout_in_trace(on_cpu: bool) -> Any:
    """Trace the ``aten.dropout`` calls that composite operators make on CPU as eager runs them
    (`cpu_dropout`: a float noise tensor saved for backward, not a bool mask).

    ``scaled_dot_product_attention`` with ``dropout_p`` on CPU eager runs
    ``_scaled_dot_product_attention_math``, which calls ``at::dropout`` on the attention weights; the
    trace would decompose that into ``native_dropout`` (one byte per element kept for backward where
    eager keeps four, and other random bits).  `use_eager_kernels` only sees the dropouts of the
    exported graph, not the ones inside a composite op the joint trace decomposes."""
    op = torch.ops.aten.dropout.default
    keys = (torch._C.DispatchKey.Autograd, torch._C.DispatchKey.CompositeImplicitAutograd)
    if not on_cpu or not all(k in op.py_kernels for k in keys):
        yield
        return
    originals = {k: op.py_kernels[k] for k in keys}

    def kernel(key: torch._C.DispatchKey) -> Callable[..., torch.Tensor]:
        def dropout(input: torch.Tensor, p: float, train: bool | None) -> torch.Tensor:
            if train and 0 < p < 1 and input.numel() and input.device.type == "cpu":
                return torch.ops.memviz.cpu_dropout(input, p)[0]
            return originals[key](input, p, train)
        return dropout

    for k in keys:
        op.py_kernels[k] = kernel(k)
    op._dispatch_cache.clear()
    try:
        yield
    finally:
        op.py_kernels.update(originals)
        op._dispatch_cache.clear()


#: batch norm's operators and the argument whose layout the CPU kernel gives the result: ``batch_norm_cpu``
#: and its backward allocate ``empty_like(input, input.suggest_memory_format())``
_CPU_BATCH_NORM_LAYOUT = {
    torch.ops.aten._native_batch_norm_legit_functional.default: 0,
    torch.ops.aten._native_batch_norm_legit.default: 0,
    torch.ops.aten._native_batch_norm_legit.no_stats: 0,
    torch.ops.aten._native_batch_norm_legit_no_training.default: 0,
    torch.ops.aten.native_batch_norm.default: 0,
    torch.ops.aten.native_batch_norm_backward.default: 1,
}


@contextlib.contextmanager
def cpu_batch_norm_layouts_in_trace(on_cpu: bool) -> Iterator[None]:
    """Fake batch norm's first output laid out as the CPU kernel lays it out.

    The fake kernels (torch's decompositions, which fake tensors run from `torch._decomp`'s table, and the
    Python dispatcher as Meta kernels) compute an elementwise result that keeps the input's strides; the
    CPU kernel returns a tensor in the input's suggested memory format, contiguous for a 3-d input.  On a
    transposed input (PatchTST's ``BatchNorm1d`` over ``hidden.transpose(1, 2)``) the trace then took the
    transposed-back output as viewable (a ``view`` for the next ``linear``) that the replay's real tensor
    is not: the profile failed with "view size is not compatible with input tensor's size and stride"."""
    from torch._decomp import decomposition_table
    from torch._prims_common import suggest_memory_format

    if not on_cpu:
        yield
        return
    meta = torch._C.DispatchKey.Meta
    table = {op: decomposition_table[op] for op in _CPU_BATCH_NORM_LAYOUT if op in decomposition_table}
    kernels = {op: op.py_kernels[meta] for op in _CPU_BATCH_NORM_LAYOUT if meta in op.py_kernels}

    def laid_out(op: torch._ops.OpOverload, decomp: Callable[..., Any]) -> Callable[..., Any]:
        # its module and name kept: fake tensors take a table entry only where it is torch's own
        @functools.wraps(decomp)
        def run(*args: Any, **kwargs: Any) -> Any:
            out = decomp(*args, **kwargs)
            like = args[_CPU_BATCH_NORM_LAYOUT[op]]
            first = out[0]
            if not isinstance(first, torch.Tensor) or like.device.type != "cpu":
                return out
            fmt = suggest_memory_format(like)
            if first.is_contiguous(memory_format=fmt):
                return out
            return (torch.empty_like(first, memory_format=fmt), *out[1:])
        return run

    decomposition_table.update({op: laid_out(op, fn) for op, fn in table.items()})
    for op, fn in kernels.items():
        op.py_kernels[meta] = laid_out(op, fn)
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        decomposition_table.update(table)
        for op, fn in kernels.items():
            op.py_kernels[meta] = fn
            op._dispatch_cache.clear()


def _cuda_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
               scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` as CUDA (sm80+) runs it, as far as it is decided without a GPU.

    torch's selection (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, ``select_sdp_backend``:
    flash, then memory-efficient, then math, each taken where its ``check_*`` constraints pass):
    fp16/bf16 without a mask, head size up to 256 (``check_head_dim_size_flash``) -> flash attention
    (``_scaled_dot_product_flash_attention``); fp32 (flash has no fp32 kernel) or a mask -> memory-efficient
    attention (``_scaled_dot_product_efficient_attention``, the mask as ``attn_bias``; a bool mask becomes
    an additive float one, as ``preprocess_mask`` does); ``enable_gqa``, or head rows that are not 16-byte
    aligned (``check_head_dim_size_mem_efficient``) -> the math path, whose dropout is ``native_dropout``.
    Both fused kernels save only the output, the logsumexp and the RNG seed/offset for backward, where the
    math path saves the T x T weights.  Not modelled: cuDNN attention (not chosen by default for these
    inputs), flash's absence before sm80 (a V100 runs memory-efficient attention in fp16 too: both save
    the same tensors) and the head-size padding the fused paths apply."""
    head = query.shape[-1]
    if not enable_gqa and attn_mask is None and query.dtype in (torch.float16, torch.bfloat16) \
            and head <= 256 and key.shape[-1] == value.shape[-1] == head:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    alignment = 16 // query.element_size()
    if enable_gqa or head % alignment or value.shape[-1] % alignment:
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros((), dtype=query.dtype, device=query.device).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, needs_lse, dropout_p, is_causal, scale=scale)[0]


@contextlib.contextmanager
def cuda_attention_in_trace(family: str | None) -> Any:
    """For a CUDA target traced on this host (`kernel_family` ``"cuda"``), trace
    ``scaled_dot_product_attention`` as the fused kernel CUDA picks (`_cuda_sdpa`), not the CPU's choice
    (its math path with dropout: softmax weights and their dropout noise saved for backward).  Overrides
    the op's Python kernels as `eager_cpu_dropout_in_trace` does ``aten.dropout``'s, restored on exit."""
    if family != "cuda":
        yield
        return
    op = torch.ops.aten.scaled_dot_product_attention.default
    keys = (torch._C.DispatchKey.Autograd, torch._C.DispatchKey.CompositeImplicitAutograd)
    originals = {k: op.py_kernels[k] for k in keys if k in op.py_kernels}
    for k in keys:
        op.py_kernels[k] = _cuda_sdpa
    op._dispatch_cache.clear()
    try:
        yield
    finally:
        for k in keys:
            op.py_kernels.pop(k, None)
        op.py_kernels.update(originals)
        op._dispatch_cache.clear()


# --- tracing ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def host_random_draws() -> Iterator[list[str]]:
    """Yields a list that names, on exit, the random generators outside torch (Python's ``random``,
    NumPy's global one) the block drew from.  A trace runs the model's Python once: what those draw
    becomes a constant of the graph (BigBird's random attention blocks, ``np.random`` in training mode),
    where eager draws again at every step, so no exported step can match eager's outputs."""
    import random

    numpy = sys.modules.get("numpy")
    before = host_rng_states()
    moved: list[str] = []
    try:
        yield moved
    finally:
        if random.getstate() != before[0]:
            moved.append("random")
        if numpy is not None and _numpy_state_moved(before[1], numpy.random.get_state(legacy=False)):
            moved.append("numpy.random")


HostStates = tuple[Any, Any]


def host_rng_states() -> HostStates:
    """The states of the random generators outside torch: Python's ``random``, NumPy's global one (None
    where NumPy is not imported)."""
    import random

    numpy = sys.modules.get("numpy")
    return random.getstate(), numpy.random.get_state(legacy=False) if numpy else None


def host_rng_forked() -> contextlib.AbstractContextManager[None]:
    """The host generators left after the block as they were before it (`fork_rng` for torch's)."""
    return host_rng_at(host_rng_states())


@contextlib.contextmanager
def host_rng_at(states: HostStates) -> Iterator[None]:
    """The host generators (`host_rng_states`) set to `states` inside the block, and left after it as
    they were before it."""
    now = host_rng_states()
    _set_host_rng(states)
    try:
        yield
    finally:
        _set_host_rng(now)


def _set_host_rng(states: HostStates) -> None:
    import random

    random.setstate(states[0])
    numpy = sys.modules.get("numpy")
    if numpy is not None and states[1] is not None:
        numpy.random.set_state(states[1])


def eager_torch_draws(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                      mode: str) -> tuple[int, list[torch.Tensor], tuple[int, ...]]:
    """How many operators draw from torch's generators in one eager forward of `model` (`is_random`'s
    tag; CPU ``dropout`` dispatches one ``bernoulli_``, as its capture runs one ``memviz::cpu_dropout``),
    with grad enabled as the `mode`'s trace has it (a forward may branch on ``torch.is_grad_enabled()``),
    the RNG forked and the buffers kept: the user's model and streams are left as they were.  Also the
    tensors the model keeps across calls and the outputs reference cycles hold (`kept_across_calls`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    draws = [0]
    seen: list[weakref.ref[torch.Tensor]] = []

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            draws[0] += draws_random(func)
            out = func(*a, **(kw or {}))
            seen.extend(weakref.ref(t) for t in pytree.tree_leaves((a, kw, out))
                        if isinstance(t, torch.Tensor))
            return out

    # a uniform draw's reads as the trace takes them (`draws_at_their_top`): a layer run draws its masks
    with _forked_rng(_model_tensors(model, args, kwargs)), buffers_kept(model), \
            torch.set_grad_enabled(mode == "train"), draws_at_their_top(), Counter():
        out = model(*args, **(kwargs or {}))
    outputs = [weakref.ref(t) if isinstance(t, torch.Tensor) else None for t in pytree.tree_leaves(out)]
    del out
    return draws[0], *kept_across_calls(model, args, kwargs, seen, outputs)


def kept_across_calls(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                      seen: Sequence[weakref.ref[torch.Tensor]],
                      outputs: Sequence[weakref.ref[torch.Tensor] | None] = ()
                      ) -> tuple[list[torch.Tensor], tuple[int, ...]]:
    """The tensors one eager forward made or read (`seen`) that are still alive once it has returned and
    its outputs are gone, and are not the model's parameters, buffers or inputs: state the model keeps
    across calls, as a buffer (transformers' BEiT caches its relative position index with an LRU cache,
    built on the first call and read by every later one).  One per storage, the largest view.

    Also which of the forward's `outputs` (its flat output tensors, dropped) only reference cycles still
    held: Python frees those only when its cyclic garbage collector next runs, at no point of the step
    one can tell.  HF Informer's loss builds a ``torch.distributions.AffineTransform`` on the outputs'
    ``loc`` and ``scale``, which its inverse transform holds in a cycle: 16 B the eager step held to its
    end that the graph freed once the loss had read them (`memviz.apply(verify=True)` measured 12 B over
    the plan of the model's own step)."""
    alive = [i for i, ref in enumerate(outputs) if ref is not None and ref() is not None]
    gc.collect()  # the outputs' autograd graph and what it saved
    cycled = tuple(i for i in alive if outputs[i]() is None)  # type: ignore[misc]
    own = {_storage_key(t) for t in _model_tensors(model, args, kwargs)}
    kept: dict[int, torch.Tensor] = {}
    for ref in seen:
        t = ref()
        if t is None or isinstance(t, torch._subclasses.FakeTensor) or t.device.type == "meta":
            continue
        key = _storage_key(t)
        if key not in own and (key not in kept or t.numel() > kept[key].numel()):
            kept[key] = t
    return list(kept.values()), cycled


def kept_values(gm: torch.fx.GraphModule, kept: Sequence[torch.Tensor]) -> tuple[str, ...]:
    """The joint graph's forward FX values standing for the tensors the model keeps across calls
    (`kept_across_calls`), one per tensor.  The trace builds such a tensor again from constants at each
    reader (transformers turns its caches off while torch compiles or exports), where eager builds it once
    and holds it for good: one storage, which every reader reads and every autograd node reading it
    saves.  A value is matched when its computation reads no graph input and no random generator and it
    equals the kept tensor (shape, dtype, values); the first match stands for it and the later ones are
    replaced by it in `gm` (their constant computations dropped), so the export builds it once per step
    too.  The eager graph holds it to the step's end (`memviz.profile`, sac plans: BEiT measured 2.21 KiB
    over a plan whose graph built and freed it in each layer)."""
    if not kept:
        return ()
    shapes = {(tuple(t.shape), t.dtype) for t in kept}
    env: dict[str, Any] = {}
    found: dict[int, list[torch.fx.Node]] = {}
    for n in list(forward_calls(gm)):
        if any(a.op == "placeholder" or (a.op == "call_function" and a.name not in env)
               for a in n.all_input_nodes) or draws_random(n.target):
            continue
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a.name]
                                             if a.op == "call_function" else _attr(gm, str(a.target)))
        try:
            env[n.name] = value = n.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an op that cannot run outside the trace is no constant
            continue
        if not isinstance(value, torch.Tensor) or (tuple(value.shape), value.dtype) not in shapes:
            continue
        for i, t in enumerate(kept):
            if t.shape == value.shape and t.dtype == value.dtype and torch.equal(t.cpu(), value.cpu()):
                found.setdefault(i, []).append(n)
    for first, *rest in found.values():
        for n in rest:
            old = _storage_key(n.meta["val"])
            n.replace_all_uses_with(first)
            _erase_unused(gm, n, set(env))
            _viewing(gm, old, first)
    if any(len(nodes) > 1 for nodes in found.values()):
        gm.recompile()
    return tuple(nodes[0].name for nodes in found.values())


def _viewing(gm: torch.fx.GraphModule, old: int, base: torch.fx.Node) -> None:
    """The fake values of `gm`'s views of fake storage `old` made again, now that they view `base`'s value
    (the capture names a storage by its fake values' storage)."""
    mode = torch._guards.detect_fake_mode([base.meta["val"]])
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if n.op == "call_function" and isinstance(val, torch.Tensor) and _storage_key(val) == old:
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta.get("val"))
            with mode:
                n.meta["val"] = n.target(*args, **kwargs)


def _erase_unused(gm: torch.fx.GraphModule, node: torch.fx.Node, erasable: set[str]) -> None:
    """Erase `node` from `gm` and then each of its inputs in `erasable` that nothing reads any more."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.users or n.name not in erasable or n.graph is not gm.graph:
            continue
        inputs = n.all_input_nodes
        gm.graph.erase_node(n)
        erasable.discard(n.name)
        stack.extend(inputs)


def graph_torch_draws(gm: torch.fx.GraphModule) -> int:
    """How many operators of the joint graph's forward draw from torch's generators."""
    return sum(draws_random(n.target) for n in forward_calls(gm))


def traced_as_eager_draws(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, mode: str,
                          loss_fn: LossFn | None, family: str | None) -> tuple[Any, ...]:
    """`trace_joint` of the model as eager runs it from now on, with what it specialised on, the host
    generators it drew from, and ``(eager's draws, the graph's)`` from torch's generators per forward where
    they differ (`Captured.torch_draws`; the profile warns), else None.

    A first call may change a model for good, and the trace's run of the forward is not that call (after
    torch.export the flag that says the change is done is as before: `tests/test_rng_order.py`'s
    FirstCallRebuild): Hugging Face BigBird, at a sequence below its block-sparse minimum, swaps in new
    attention modules on its first call (``nn.Linear``s initialised from the global generator: 12
    ``uniform_`` before the first dropout) and stays in full attention.  Traced first, the graph kept
    those draws, eager (from memviz's own measured step on) never made them again, and the exported step
    drew its dropout masks 12 draws further along the stream: outputs 0.31 off eager's, silently.  So one
    eager forward runs first (`eager_torch_draws`: RNG forked, buffers kept), where the user's
    own first call would have made those changes; its count, or a second one's where the first was that
    first call, must equal the graph's.  Skipped where eager cannot be compared: a meta-device model
    draws nothing, and a profile estimated for a CUDA target on a CPU host traces CUDA's kernels where
    eager runs the CPU's (its plans cannot be exported: `export.check_not_estimated_for_cuda`)."""
    on_meta = any(t.device.type == "meta" for t in _model_tensors(model, args, kwargs))
    comparable = not on_meta and not (family == "cuda" and _on_cpu(args, model))
    first, kept, cycled = eager_torch_draws(model, args, kwargs, mode) if comparable else (None, [], ())
    specialised: list[str] = []
    drawn: list[str] = []
    with host_random_draws() as host_random:
        gm, out_spec, views = trace_joint(model, args, kwargs, mode, loss_fn, specialised, family, drawn)
    traced = graph_torch_draws(gm)
    mismatch = None
    if first is not None and traced != first:
        again, _, _ = eager_torch_draws(model, args, kwargs, mode)
        mismatch = None if traced == again else (again, traced)
    return gm, out_spec, views, specialised, drawn, host_random, mismatch, kept_values(gm, kept), cycled


def _numpy_state_moved(before: dict[str, Any], after: dict[str, Any]) -> bool:
    import numpy

    return any(not numpy.array_equal(before["state"][k], after["state"][k]) for k in before["state"]) \
        or before.get("has_gauss") != after.get("has_gauss")


@contextlib.contextmanager
def library_frames_in_stack_traces(model: nn.Module | None = None) -> Any:
    """Keep the frames of ``torch.nn.functional`` and ``torch.functional``, and of the functions and
    methods defined in `model`'s own source files, in the nodes' stack traces.

    torch.export records only ``forward`` frames, so the statements of a functional such as
    ``F.multi_head_attention_forward`` are invisible, yet its locals (``q``, ``attn_mask``) hold
    tensors until it returns in eager mode: `memviz.profiling.profile.python_local_holds` reads them there.
    The same for a model's helpers: HF Mamba2's chunked scan (``mamba2_chunk_scan``, behind a kernel-hub
    decorator) holds a dozen locals to its return, all read as one statement of the mixer and freed at
    their last readers (its checkpointed recomputation 15.5 KiB over a sac plan)."""
    import torch.fx.proxy as fx_proxy
    from torch import functional as torch_functional
    from torch.nn import functional as nn_functional

    anchors = getattr(fx_proxy, "_STACK_TRACE_ANCHORS", None)
    if anchors is None:  # torch before 2.13 (the CUDA 2.11 builds): stack traces keep forward frames only
        yield
        return
    found = {(fn.__code__.co_filename, fn.__code__.co_name)
             for mod in (nn_functional, torch_functional) for fn in vars(mod).values()
             if inspect.isfunction(fn) and fn.__code__.co_filename == mod.__file__}
    found |= _model_source_functions(model) if model is not None else set()
    added = found - anchors
    anchors |= added
    try:
        yield
    finally:
        anchors -= added


def _model_source_functions(model: nn.Module) -> set[tuple[str, str]]:
    """(file, name) of each function and method defined in the source files of `model`'s module classes
    outside torch (a decorated function by the code it wraps: ``functools.wraps``' ``__wrapped__``)."""
    found: set[tuple[str, str]] = set()
    for name in {type(m).__module__ for m in model.modules()}:
        mod = sys.modules.get(name)
        file = getattr(mod, "__file__", None)
        if file is None or file.startswith(_TORCH_DIR):
            continue
        values = list(vars(mod).values())
        values += [v for cls in values if isinstance(cls, type) for v in vars(cls).values()]
        for value in values:
            fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            fn = inspect.unwrap(fn) if inspect.isfunction(fn) else fn
            if inspect.isfunction(fn) and fn.__code__.co_filename == file:
                found.add((file, fn.__code__.co_name))
    return found


def _user_frame() -> str:
    """``file:line`` of the innermost caller outside torch and this module (where the user called)."""
    frame = inspect.currentframe()
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith(_TORCH_DIR) and file != __file__ and "contextlib" not in file:
            return f"{file}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _importable(cls: type) -> bool:
    """Whether ``module.qualname`` imports back to `cls`: how the exported graph names a kept Function."""
    import importlib

    obj: Any = importlib.import_module(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


@contextlib.contextmanager
def buffers_kept(module: Any) -> Iterator[list[str]]:
    """`module`'s buffers as they were once the block ends; the list it yields is filled, at the end, with
    the names of those the block changed.  memviz runs the user's model (its eager step, measured) and
    its captured graphs (timed, measured) without changing it, and BatchNorm in train mode updates its
    running statistics in place: in the user's own tensors where an exported program holds them (not
    copies), and where ``torch.utils.checkpoint`` recomputes a region in the backward, outside the
    functional call that gave the step copies of the buffers."""
    kept = ([(name, b, b.detach().clone()) for name, b in module.named_buffers()]
            if isinstance(module, nn.Module) else [])
    changed: list[str] = []
    try:
        yield changed
    finally:
        with torch.no_grad():
            for name, b, value in kept:
                if not torch.equal(b, value):
                    changed.append(name)
                    b.copy_(value)


@contextlib.contextmanager
def autograd_functions_in_graph() -> Any:
    """Keep each custom ``torch.autograd.Function`` one call in the exported graph, so the joint trace
    differentiates it with the backward the user wrote.

    torch.export (non-strict) runs a Function's forward as plain operators and drops its ``backward``:
    the joint graph would hold autograd's derivative of the forward (a straight-through estimator or a
    scaled gradient silently lost).  Kept as a call, AOTAutograd runs the real Function on its tensors,
    and autograd traces the user's backward.  The reentrant ``torch.utils.checkpoint`` Function is run
    as its plain function with gradients on (its backward is by definition the gradient of that
    function; exported as is, its forward runs under ``no_grad`` and the block's parameters get no
    gradient).  A Function the graph cannot name (a class defined inside a function) or with arguments
    it cannot hold raises a `CaptureError` naming it and the calling line."""
    from torch._export.wrappers import allow_in_pre_dispatch_graph
    from torch.utils.checkpoint import CheckpointFunction

    original = torch.autograd.Function.__dict__["apply"]
    kept = allow_in_pre_dispatch_graph(original.__func__)

    def refuse(cls: type, why: str) -> CaptureError:
        where = _user_frame()
        return CaptureError(f"custom torch.autograd.Function {cls.__qualname__} called at {where}: {why}; "
                            "memviz cannot trace its backward.  Define the Function at module level with "
                            "tensor, number or None arguments (or profile with fallback=True)",
                            source=where)

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_exporting():
            return original.__func__(cls, *args, **kwargs)
        if cls is CheckpointFunction:
            run_function, _preserve_rng, *inputs = args
            return run_function(*inputs)
        if cls.__module__ == torch._library.autograd.__name__:
            # the autograd kernel of a ``torch.library.custom_op`` with ``register_autograd``: the op is
            # already one node of the graph (transformers' MoE ``grouped_mm_fallback``) and the joint
            # trace runs its registered backward op, so it is torch's, not a Function to keep
            return original.__func__(cls, *args, **kwargs)
        if not _importable(cls):
            raise refuse(cls, "it is not importable by its module and qualified name")
        graphable = (torch.Tensor, int, float, bool, str, type(None), torch.dtype, torch.device)
        odd = [type(x).__name__ for x in pytree.tree_leaves((args, kwargs)) if not isinstance(x, graphable)]
        if odd:
            raise refuse(cls, f"it takes arguments of type {', '.join(sorted(set(odd)))}")
        return kept(cls, *args, **kwargs)

    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.autograd.Function.apply = original  # type: ignore[method-assign]


def _scalar_loss(loss: Any) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise CaptureError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}")
    return loss


def unused_outputs(gm: torch.fx.GraphModule, out_spec: pytree.TreeSpec, loss_fn: LossFn | None) -> set[int]:
    """Flat indices of the floating outputs of `gm` that `loss_fn` gives no gradient (measured on
    fake tensors shaped like the outputs' ``meta["val"]``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    # a constant output (an int, None) is handed to the loss as itself
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a
            for a in pytree.tree_leaves(gm.graph.output_node().args[0], is_leaf=lambda x: x is None)]
    with FakeTensorMode(allow_non_fake_inputs=True):
        flat = [torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=v.device)
                if isinstance(v, torch.Tensor) else v for v in vals]
        diff = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not diff:
            return set()
        for i in diff:
            flat[i].requires_grad_(True)
        loss = _scalar_loss((loss_fn or default_loss)(pytree.tree_unflatten(flat, out_spec)))
        grads = torch.autograd.grad(loss, [flat[i] for i in diff], allow_unused=True)
    unused = {i for i, g in zip(diff, grads, strict=True) if g is None}
    # an output another (used) output views stays: the view's gradient reaches it (`OutputView`), and
    # detached it would leave the view aliasing an intermediate two outputs share (refused)
    used = {_storage_key(vals[i]) for i in diff if i not in unused}
    return {i for i in unused if _storage_key(vals[i]) not in used}


def detach_outputs(gm: torch.fx.GraphModule, indices: set[int]) -> None:
    """Detach the flat outputs of `gm` at `indices`, so the joint trace gives them no tangent.

    Eager autograd never runs the backward of an output the loss does not use (no gradient reaches
    its autograd node), and an output gradient it never receives is None: differentiating such an
    output against a zero tangent would add backward ops (and their memory) eager mode never runs."""
    if not indices:
        return
    out = gm.graph.output_node()
    leaves, spec = pytree.tree_flatten(out.args[0], is_leaf=lambda x: x is None)
    with gm.graph.inserting_before(out):
        leaves = [gm.graph.call_function(torch.ops.aten.detach.default, (a,)) if i in indices else a
                  for i, a in enumerate(leaves)]
    out.args = (pytree.tree_unflatten(leaves, spec),)
    gm.recompile()


@contextlib.contextmanager
def eager_attention_masks(model: nn.Module | None = None, args: Sequence[Any] = (),
                          kwargs: dict[str, Any] | None = None, *, fake: bool = False) -> Iterator[None]:
    """Hugging Face builds the S x S causal mask only while exporting: eager skips it and calls SDPA with
    ``is_causal=True`` when no padding mask needs reading (``masking_utils._ignore_causal_mask_sdpa``),
    so the exported graph held an S x S mask (and its additive copy) that eager never allocates.  Its
    guard against exporting protects graphs reused for other inputs; a captured graph is specialised to
    the captured shapes, and a padding mask given as an input is still traced (``is_tracing``), so
    the capture takes eager's branch for these shapes.

    transformers 5.24 asks ``is_torchdynamo_exporting()``; earlier releases (5.17) ask
    ``is_tracing(padding_mask)``, which is true under export even when there is no padding mask.  The
    mask then also changes the kernel: a grouped-query model repeats its keys and values instead of
    SDPA's ``enable_gqa``, so on CUDA in fp32 the capture ran memory-efficient attention while eager ran
    the math kernel (an H100 measured eager 1534 MiB against a 1110 MiB capture).  Both guards are
    answered as eager answers them: no mask is not traced; a mask tensor still is.

    Without a key/value cache (``use_cache=False``, training) both releases also look for packed
    sequences in the position ids (``find_packed_sequence_indices``), which reads tensor values and so
    under export always reports packing: the mask came back (Llama with ``use_cache=False`` on an H100:
    eager 1233 MiB against a 889 MiB capture, and ``memviz.apply`` plans up to 24% over).  The answer is
    eager's on the example (`model`, `args`, `kwargs`): position ids the model derives itself count
    0, 1, 2... in every row (never packed); given ones are read when they hold real values.

    `fake`: the step runs eagerly on fake tensors (an estimated parallel rank, `memviz.parallel.distributed`).
    transformers' ``utils.import_utils.is_tracing(tensor)`` counts a FakeTensor as tracing, so on fake
    tensors ``masking_utils`` (``_ignore_causal_mask_sdpa``'s cache offset and padding mask,
    ``find_packed_sequence_indices``) built the S x S mask an eager step on real tensors skips (a Llama-3-8B
    rank at 4096 tokens: 36 masks, 1.06 GiB).  Here a fake tensor is not a trace, as on real tensors: a
    decision from shapes takes eager's branch, and one that reads values (``fast_all(padding_mask)``)
    reaches a fake tensor's value, which raises (`memviz.parallel.distributed` names the inputs) instead
    of taking the traced branch."""
    mu = sys.modules.get("transformers.masking_utils")
    if mu is None:
        yield
        return
    guards = ("is_torchdynamo_exporting", "is_tracing", "find_packed_sequence_indices")
    saved = {name: getattr(mu, name) for name in guards if hasattr(mu, name)}
    if "is_torchdynamo_exporting" in saved:
        mu.is_torchdynamo_exporting = lambda: False
    if "is_tracing" in saved:
        is_tracing = saved["is_tracing"]
        # only an explicit None (no padding mask) changes: a bare is_tracing() may guard a data read;
        # `fake`: a fake tensor alone asks only the global tests (dynamo, jit, stream capture)
        mu.is_tracing = lambda *tensor: (
            False if tensor == (None,) or (len(tensor) == 1 and _built_from_constants(tensor[0]))
            else is_tracing() if fake and tensor and isinstance(tensor[0], torch._subclasses.FakeTensor)
            else is_tracing(*tensor))
    if "find_packed_sequence_indices" in saved and not _packed_in_example(
            saved["find_packed_sequence_indices"], model, args, kwargs):
        mu.find_packed_sequence_indices = (_unpacked_as_eager(mu, saved["find_packed_sequence_indices"])
                                           if fake else lambda position_ids: None)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(mu, name, fn)


def _built_from_constants(t: Any) -> bool:
    """Whether the tensor `t` being traced is computed from no input, parameter or buffer: a mask the
    forward builds itself (Nystromformer's ``torch.ones((batch, seq))`` when none is given).  Its values
    are the same for every input of the traced shapes, so the trace may read them as eager does (the
    read is specialised on eager's value, `specialising_on_example_values`)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

    mode = get_proxy_mode()
    if mode is None or not isinstance(t, torch.Tensor):
        return False
    try:
        node = get_proxy_slot(t, mode.tracer).proxy.node
    except KeyError:
        return False
    pending, seen = [node], set()
    while pending:
        n = pending.pop()
        if n.op in ("placeholder", "get_attr"):
            return False
        if n not in seen:
            seen.add(n)
            pending.extend(n.all_input_nodes)
    return True


def _unpacked_as_eager(mu: Any, find: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], None]:
    """transformers' ``masking_utils.find_packed_sequence_indices`` as eager runs it on position ids that
    are not packed: the same operators (the sequence ids, then the read of their last column, whose value
    eager found to be 0 on the example), answering None (not packed) without reading a fake value."""
    def unpacked(position_ids: torch.Tensor) -> None:
        is_tracing = mu.is_tracing
        mu.is_tracing = lambda *tensor: True  # `find` returns the sequence ids before its read
        try:
            ids = find(position_ids)
        finally:
            mu.is_tracing = is_tracing
        (ids[:, -1] == 0).all()  # the read's own operators, as eager runs them (its answer: not packed)
        return None
    return unpacked


def _packed_in_example(find: Callable[[torch.Tensor], Any], model: nn.Module | None, args: Sequence[Any],
                       kwargs: dict[str, Any] | None) -> bool:
    """Whether eager Hugging Face finds packed sequences in the example's position ids (`find`, its
    ``find_packed_sequence_indices``); True (the library's own traced answer) when that cannot be told:
    no model, arguments that do not bind to its forward, or position ids without values (fake, meta)."""
    if model is None:
        return True
    try:
        bound = inspect.signature(model.forward).bind_partial(*args, **(kwargs or {}))
    except (TypeError, ValueError):
        return True
    sig = bound.signature.parameters
    extra = next((bound.arguments.get(n, {}) for n, prm in sig.items() if prm.kind is prm.VAR_KEYWORD), {})
    given = bound.arguments.get("position_ids", extra.get("position_ids"))
    if given is None:
        return False  # derived from the cache position: 0, 1, 2... in every row
    if not isinstance(given, torch.Tensor) or isinstance(given, torch._subclasses.FakeTensor) \
            or given.device.type == "meta":
        return True
    with torch.no_grad():
        return find(given) is not None


def register_library_pytrees(model: nn.Module) -> None:
    """Output containers libraries return that pytree does not know: Hugging Face models return their
    key/value cache (``DynamicCache``, ``EncoderDecoderCache``) even in training unless ``use_cache=False``.
    transformers' own exporter registers them as pytree nodes (their tensors become outputs of the
    graph, alive as long as the user holds the output, as in eager); use it for the model's classes."""
    if "transformers" not in sys.modules:
        return
    try:
        from transformers import PreTrainedModel
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:  # an older transformers without the exporter: its error message still says what
        return
    for mod in model.modules():
        if isinstance(mod, PreTrainedModel):
            register_cache_pytrees_for_model(mod)
            return


@torch.library.custom_op("memviz::call_argument", mutates_args=())
def call_argument(x: torch.Tensor, block: str) -> None:
    """A marker the export trace records where checkpointable block `block` is called with tensor `x`
    (`_export`); taken out of the exported graph before anything runs it."""


@call_argument.register_fake
def _call_argument_fake(x: torch.Tensor, block: str) -> None:
    return None


# export keeps an operator without outputs only when it has side effects
torch.fx.node.has_side_effect(torch.ops.memviz.call_argument.default)


def _export(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """torch.export (non-strict) with the tensors each checkpointable block (`block_paths`) is called with
    marked: a forward pre-hook calls `call_argument` on each, a side-effecting operator both traces keep,
    so a value no op reads but a block's call gets stays in the joint graph (`call_arguments` reads the
    marks there and takes them out).  torch.export's own ``preserve_module_call_signature`` is not used:
    it rebuilds a call's arguments from their flat tensors, so a layer appending to HF's ``DynamicCache``
    wrote into a copy and the captured step returned an empty cache.  The arguments are taken as
    `memviz.apply` passes them (the KV cache off, `memviz.runtime.apply._without_cache`)."""
    import warnings

    from memviz.runtime.apply import ApplyWarning, _without_cache

    def mark(path: str, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ApplyWarning)
            a, k = _without_cache(module, {}, a, k)
        for t in pytree.tree_leaves((a, k)):
            if isinstance(t, torch.Tensor):
                call_argument(t, path)

    handles = [model.get_submodule(path).register_forward_pre_hook(
        functools.partial(mark, path), with_kwargs=True) for path in block_paths(model)]
    try:
        return torch.export.export(model, tuple(args), kwargs or {}, strict=False)
    finally:
        for h in handles:
            h.remove()


def block_paths(model: nn.Module) -> list[str]:
    """The children of the model's outermost ModuleList / Sequential containers: the blocks a sac plan may
    checkpoint (`memviz.plans.sac.candidate_blocks` keeps those that ran as one contiguous call).  A child
    that is itself a ModuleList or ModuleDict is never called (the model loops over it): its children
    are the blocks (Funnel's ``encoder.blocks[i][j]``: checkpointing ``encoder.blocks[i]`` ran nothing, and
    its plan was 117 KiB under what the step held)."""
    containers = [n for n, m in model.named_modules() if isinstance(m, (nn.ModuleList, nn.Sequential))]
    outer = [c for c in containers
             if not any(o != c and (o == "" or c.startswith(o + ".")) for o in containers)]

    def called(path: str, module: nn.Module) -> list[str]:
        if not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            return [path]
        return [p for child, m in module.named_children() for p in called(f"{path}.{child}", m)]

    return [p for c in outer for child, m in model.get_submodule(c).named_children()
            for p in called(f"{c}.{child}" if c else child, m)]


def call_arguments(joint: torch.fx.GraphModule) -> dict[str, tuple[str, ...]]:
    """Block path -> the joint graph's FX values of the tensors its call got, read from the `call_argument`
    marks `_export` put there, which are then taken out of `joint`.  The marks keep in the graph a value
    only a block's call gets: Longformer's ``is_index_global_attn``, which only ``.any().item()`` reads (a
    branch the trace took on the example's values), or Funnel's ``attention_inputs`` ``gather``, which no
    op reads; the trace dropped them, and the checkpointed block held them unplanned (28 B and 3.75 KiB
    over a sac plan at its minimum).  Such a value is now computed as eager computes it and freed where
    eager frees it.  A graph input (always held) is left out."""
    marks = list(joint.graph.find_nodes(op="call_function", target=torch.ops.memviz.call_argument.default))
    out: dict[str, list[str]] = {}
    for n in marks:
        x, path = n.args
        if x.op != "placeholder":
            out.setdefault(path, []).append(x.name)
        joint.graph.erase_node(n)
    joint.recompile()
    return {path: tuple(dict.fromkeys(names)) for path, names in out.items()}


def _data_dependent(err: BaseException) -> bool:
    """Whether tracing stopped on a tensor's value: a Python branch on it, or an op whose output
    shape depends on it (``_ctc_loss.Tensor``: the longest target)."""
    from torch._subclasses.fake_tensor import DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    while err is not None:
        if isinstance(err, (GuardOnDataDependentSymNode, DynamicOutputShapeException)):
            return True
        err = err.__cause__ or err.__context__
    return False


def _model_tensors(model: nn.Module, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors a call of `model` starts from: its inputs, parameters and buffers."""
    return [t for t in (*pytree.tree_leaves((args, kwargs)), *model.parameters(), *model.buffers())
            if isinstance(t, torch.Tensor)]


@contextlib.contextmanager
def _forked_rng(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    with accelerator.fork_rng(accelerator.devices_of(list(tensors))):
        yield


def _eager_shapes(kernel: Callable[..., Any], eager: EagerReads, record: list[str]) -> Callable[..., Any]:
    """`kernel` (a fake tensor kernel) that, for an operator whose output shape depends on values
    (``_ctc_loss.Tensor``: the longest target; ``masked_select``; ``nonzero``), takes the output shapes
    eager's call of that operator had on the example (`EagerReads`, per operator in call order).

    Under export such a kernel answers sizes of unbacked symbols instead of failing, on which a Python loop
    over the rows (an MoE's ``for expert in hit.nonzero()``) cannot guard: an operator tagged
    ``dynamic_output_shape`` that eager ran takes eager's sizes there too, counted over every call of that
    overload (``index.Tensor`` is sized by values only for a boolean index)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    calls: dict[Any, int] = {}

    def eager_output(fake_mode: Any, func: torch._ops.OpOverload, key: Any, queue: list[Any]) -> Any:
        # each pass over the model (export's, then the joint trace's) makes eager's calls again, in order
        n = calls[key] = calls.get(key, 0) + 1
        metas = queue[(n - 1) % len(queue)]
        with fake_mode:
            out = pytree.tree_map_only(tuple, lambda m: torch.empty_strided(*m[:2], dtype=m[2], device=m[3]),
                                       metas, is_leaf=lambda m: isinstance(m, tuple) and len(m) == 4)
        shapes = [m[0] for m in pytree.tree_leaves(metas, is_leaf=lambda m: isinstance(m, tuple)
                                                     and len(m) == 4)]
        what = f"output shapes of {func} -> {shapes}"
        if not any(r.endswith(what) for r in record):
            record.append(f"{_user_code_line()}: {what}")
        return out

    def sized_as_eager(fake_mode: Any, func: torch._ops.OpOverload, queue: list[Any], *args: Any,
                       **kwargs: Any) -> Any:
        n = calls.get(func, 0)
        env = fake_mode.shape_env
        try:
            with env.ignore_fresh_unbacked_symbols() if env is not None else contextlib.nullcontext():
                out = kernel(fake_mode, func, *args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            return eager_output(fake_mode, func, func, queue)
        if free_unbacked_symbols(out):
            return eager_output(fake_mode, func, func, queue)
        calls[func] = n + 1
        return out

    def impl(fake_mode: Any, func: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
        own = eager.overload_outputs.get(func)
        if own and torch.Tag.dynamic_output_shape in func.tags:
            return sized_as_eager(fake_mode, func, own, *args, **kwargs)
        try:
            return kernel(fake_mode, func, *args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            # eager may run another overload (``_ctc_loss`` with lists where the trace has ``.Tensor``)
            queue = eager.outputs.get(func.overloadpacket)
            if not queue:
                raise
        return eager_output(fake_mode, func, func.overloadpacket, queue)

    return impl


def _eager_scalar(kernel: Callable[..., Any], eager: EagerReads, record: list[str]) -> Callable[..., Any]:
    """``.item()`` (``bool(t)``, ``if t > 0``, ``.tolist()``, a 0-d index ``w[t]``) as the value eager read
    at the same line of the model's code, in call order (the trace follows eager's branches, so it makes
    the same reads there): a plain Python number, so the trace goes the way eager went and no guard
    remains.  Per line, because eager also reads inside operators the trace decomposes without reading
    (``one_hot``'s range check): in one call order those reads shifted every later one.  A trace that
    checks out differently from eager is refused afterwards (`check_specialised_as_eager`)."""

    # one read is ``item`` then ``_local_scalar_dense`` on the same tensor.  The tensor is kept with its
    # value: a read tensor freed at once (Autoformer's ``int(top_k_delays_index[i])`` in a loop, an expert
    # loop's index) lets the next one take its id, which then got the stale value
    read: dict[int, tuple[Any, Any]] = {}
    count: dict[str, int] = {}

    def impl(fake_mode: Any, func: torch._ops.OpOverload, arg: Any) -> Any:
        if id(arg) in read:
            return read[id(arg)][1]
        line = _user_code_line()
        values = eager.values.get(line)
        if not values:
            return kernel(fake_mode, func, arg)
        # export runs the model's Python more than once (each pass makes eager's reads again, in order)
        n = count[line] = count.get(line, 0) + 1
        value = values[(n - 1) % len(values)]
        read[id(arg)] = (arg, value)
        if n <= len(values):
            record.append(f"{line}: value {value!r}")
        return value

    return impl


@dataclass
class EagerReads:
    """What eager `model(*args)` read off tensor values on the example: every ``_local_scalar_dense``
    result per line of the model's code (`_user_code_line`), and each operator's outputs as (shape,
    stride, dtype, device), in call order."""

    values: dict[str, list[Any]] = field(default_factory=dict)
    outputs: dict[Any, list[Any]] = field(default_factory=dict)
    # the same, per overload (`_eager_shapes`: ``where.self`` is no ``where.default``)
    overload_outputs: dict[Any, list[Any]] = field(default_factory=dict)
    # the lines whose reads were off a uniform draw, read as at its top (`draws_at_their_top`)
    drawn: list[str] = field(default_factory=list)


#: the uniform draws `draws_at_their_top` follows: ``torch.rand``, ``torch.rand_like``, ``Tensor.uniform_``
_UNIFORM_DRAWS = (torch.ops.aten.rand.default, torch.ops.aten.rand.generator,
                  torch.ops.aten.rand_like.default, torch.ops.aten.uniform.default,
                  torch.ops.aten.uniform_.default)
#: the largest float32 below 1: where a draw from [0, 1) can come out highest
_TOP = 1.0 - 2.0 ** -24


def _top_of(func: Any, a: tuple[Any, ...], kw: dict[str, Any]) -> float:
    """The highest value the uniform draw ``func(*a, **kw)`` can give: ``uniform_``'s ``from + (to - from)``
    near its top, 1 otherwise."""
    if func in (torch.ops.aten.uniform.default, torch.ops.aten.uniform_.default):
        low, high = (list(a[1:3]) + [kw.get("from", 0.0), kw.get("to", 1.0)][len(a[1:3]):])
        return low + (high - low) * _TOP
    return _TOP


def _or_host_copy(shadow: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor:
    """`shadow` where there is one, else a host copy of `t` (`draws_at_their_top`'s other operands)."""
    return shadow if shadow is not None else t.detach().to("cpu", copy=True)


@contextlib.contextmanager
def draws_at_their_top() -> Iterator[list[str]]:
    """Python reads a model makes off a one-element uniform draw read as if the draw came out at its top.

    LayerDrop (Fan et al., "Reducing Transformer Depth on Demand with Structured Dropout", ICLR 2020;
    HF wav2vec2, HuBERT, WavLM, Autoformer, BART, ...) draws ``p = torch.rand([])`` per layer and skips the
    layer when ``p < layerdrop``: which layers run changes at every step, while a captured graph runs
    one fixed set.  A draw at its top skips none, the step that holds the most (every layer's
    activations, gradients and optimizer state): the graph, its plans and the measured eager step are
    that upper bound over the draws.  Only the values Python reads (``bool``, ``item``) change, through
    scalar arithmetic on the draw (``p < layerdrop``); tensors keep their real values and the generator
    moves as it does, so branches that do not depend on a draw read as eager reads them.

    Yields the list of ``file:line`` places that read such a value (one entry per read), filled while the
    block runs.  A dispatch mode: enter it outside a storage tracker, which then does not see the
    scalar copies it computes; they live on the host, so an accelerator's allocator does not count them
    either."""
    from torch.utils._python_dispatch import TorchDispatchMode

    drawn: list[str] = []
    # id(tensor) -> (a weak reference to it, its value had every draw it depends on come out at its top)
    shadows: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}

    def shade(t: torch.Tensor, shadow: torch.Tensor) -> None:
        key = id(t)

        def gone(ref: weakref.ref[torch.Tensor], key: int = key) -> None:
            if shadows.get(key, (None,))[0] is ref:
                del shadows[key]

        shadows[key] = (weakref.ref(t, gone), shadow)

    def shadow_of(t: Any) -> torch.Tensor | None:
        entry = shadows.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0]() is t else None

    class AtTheTop(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            kw = kw or {}
            out = func(*a, **kw)
            if func in _UNIFORM_DRAWS:
                if isinstance(out, torch.Tensor) and out.numel() == 1 and out.is_floating_point():
                    shade(out, torch.full(out.shape, _top_of(func, a, kw), dtype=out.dtype))
                return out
            if not shadows or not any(shadow_of(t) is not None for t in pytree.tree_leaves((a, kw))):
                return out
            if func in _READS:
                drawn.append(_user_code_line())
                return func(shadow_of(a[0]))
            outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            # scalar arithmetic only (``p < layerdrop``): a draw scaling a whole tensor is no branch
            if not outs or any(t.numel() != 1 for t in outs):
                return out
            # the other operands as host copies (one element each, or the op is no scalar arithmetic)
            sa, skw = pytree.tree_map_only(torch.Tensor, lambda t: _or_host_copy(shadow_of(t), t), (a, kw))
            if "device" in skw:
                skw["device"] = torch.device("cpu")
            for t, s in zip(outs, [t for t in pytree.tree_leaves(func(*sa, **skw))
                                   if isinstance(t, torch.Tensor)], strict=True):
                shade(t, s)
            return out

    with AtTheTop():
        yield drawn


def eager_reads(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> EagerReads:
    """Run `model` once eagerly under no_grad (the caller forks the RNG) and record `EagerReads`, every
    read off a uniform draw as at its top (`draws_at_their_top`; those places in `EagerReads.drawn`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = EagerReads()

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            out = func(*a, **(kw or {}))
            _mask_positions(func, a, reads.outputs)
            if func is torch.ops.aten._local_scalar_dense.default:
                reads.values.setdefault(_user_code_line(), []).append(out)
            else:
                metas = pytree.tree_map_only(
                    torch.Tensor, lambda t: (tuple(t.shape), tuple(t.stride()), t.dtype, t.device), out)
                reads.outputs.setdefault(func.overloadpacket, []).append(metas)
                reads.overload_outputs.setdefault(func, []).append(metas)
            return out

    with torch.no_grad(), draws_at_their_top() as drawn, Recorder():
        model(*args, **(kwargs or {}))
    reads.drawn = list(dict.fromkeys(drawn))
    return reads


#: the indexing operators whose boolean-mask indices their kernels turn into positions below the dispatcher
_MASK_INDEXING = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                  torch.ops.aten.index_put_.default, torch.ops.aten._index_put_impl_.default)


def _mask_positions(func: Any, a: tuple[Any, ...], outputs: dict[Any, list[Any]]) -> None:
    """Record under ``nonzero`` (as `eager_reads` records an operator's outputs) the positions each boolean
    index of an indexing call `func(*a)` selects.  Eager's kernel runs that ``nonzero`` where no dispatch
    mode sees it, but the trace's fake kernels, and the joint trace's backward of a masked write
    (``IndexPutBackward0`` reads ``grad[mask]``: SpecAugment's ``hidden[mask] = masked_spec_embed`` in HF's
    wav2vec2 / HuBERT / WavLM), call it on the mask and need its output's shape."""
    if func not in _MASK_INDEXING:
        return
    for index in a[1]:
        if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
            t = torch.nonzero(index)
            outputs.setdefault(torch.ops.aten.nonzero, []).append(
                (tuple(t.shape), tuple(t.stride()), t.dtype, t.device))


@contextlib.contextmanager
def specialising_on_example_values(record: list[str], eager: EagerReads) -> Iterator[None]:
    """Trace taking eager's values wherever the trace would need a tensor's value: a read (``.item()``,
    ``bool()`` of a tensor, ``if t.max() >= n``) is the value eager read (`eager_reads`), and an operator
    whose output shape depends on values gets eager's output shapes.  The graph keeps only the branch
    eager took; each decision is appended to `record` as ``"file:line code: value v"``.  Not torch's real
    tensor propagation: it decided a parameter-dependent branch and LayerDrop unlike eager."""
    from torch._subclasses import fake_impls

    checks = list(fake_impls.op_implementations_checks)
    kernels = dict(fake_impls.op_implementations_dict)
    fake_impls.op_implementations_checks[:] = [(c, _eager_shapes(fn, eager, record)) for c, fn in checks]
    fake_impls.op_implementations_dict.update(
        {op: _eager_shapes(fn, eager, record) for op, fn in kernels.items()})
    for read in _READS:
        if read in kernels:
            fake_impls.op_implementations_dict[read] = _eager_scalar(kernels[read], eager, record)
    try:
        yield
    finally:
        fake_impls.op_implementations_checks[:] = checks
        fake_impls.op_implementations_dict.clear()
        fake_impls.op_implementations_dict.update(kernels)


def _user_code_line() -> str:
    """``file:line code`` of the innermost frame on the stack outside torch and memviz."""
    import traceback

    here = str(Path(__file__).parents[1])
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith((_TORCH_DIR, here)) and "contextlib" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} `{(frame.line or '').strip()}`"
    return "?"


def trace_joint(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, mode: str,
                loss_fn: LossFn | None = None, specialised: list[str] | None = None,
                family: str | None = None, drawn: list[str] | None = None
                ) -> tuple[torch.fx.GraphModule, pytree.TreeSpec, dict[int, OutputView]]:
    """torch.export (non-strict) then AOTAutograd's joint trace (TOOLCHAIN.md recipe).

    Training: forward + backward against one tangent per model output `loss_fn` differentiates
    (the others are detached: `detach_outputs`), and the outputs that alias another output, an input or
    a parameter (`aliased_outputs`: regenerated from their base outside the graph).  Inference: the
    forward under ``no_grad``.  The model is never modified: export traces with fake tensors.
    A model whose Python branches on tensor values (HF's label range check ``labels.max() >=
    vocab_size``, LayerDrop's ``torch.rand([]) < p``) or that calls an op whose output shape depends on
    values (``ctc_loss``) is traced again taking the values eager read on the example (`eager_reads`,
    `specialising_on_example_values`), then checked against eager (`check_specialised_as_eager`); what
    that decided is listed in `specialised`.  A read off a uniform draw (LayerDrop's) is taken as the
    draw at its top gives it, the layer run (`draws_at_their_top`); its places are appended to `drawn`.
    `family` (`kernel_family`) names whose kernels the joint trace takes for dropout and attention.
    """
    specialised = [] if specialised is None else specialised

    register_library_pytrees(model)
    grad_ctx = contextlib.nullcontext() if mode == "train" else torch.no_grad()
    # inference runs no backward: a Function's forward as plain operators is exact there
    functions = autograd_functions_in_graph() if mode == "train" else contextlib.nullcontext()
    try:
        with (grad_ctx, library_frames_in_stack_traces(model), _quiet_data_dependent_logs(),
              eager_attention_masks(model, args, kwargs)):
            return _trace_joint(model, args, kwargs, mode, loss_fn, functions, contextlib.nullcontext(),
                                family=family)
    except CaptureError as err:
        if not _data_dependent(err):
            raise
    leaves = _model_tensors(model, args, kwargs)
    functions = autograd_functions_in_graph() if mode == "train" else contextlib.nullcontext()
    # the eager run and the trace draw random numbers (dropout, LayerDrop): the user's RNG must not move;
    # the trace draws from the host generators what eager drew (a NumPy mask: the positions it selects)
    with _forked_rng(leaves), host_rng_forked():
        eager = eager_reads(model, args, kwargs)
    if drawn is not None:
        drawn.extend(eager.drawn)
    with grad_ctx, library_frames_in_stack_traces(model), _forked_rng(leaves), \
            eager_attention_masks(model, args, kwargs):
        traced = _trace_joint(model, args, kwargs, mode, loss_fn, functions,
                              specialising_on_example_values(specialised, eager), specialised, family)
    check_sizes_outlive_the_step(traced[0], model, mode, specialised)
    return traced


def _sizing_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The inputs whose values size the FX node's output: a ``nonzero``'s (an operator ATen tags
    ``dynamic_output_shape`` with one tensor input), ``masked_select``'s mask, ``index.Tensor``'s boolean
    indices.  Others (``_ctc_loss``: the target lengths, not the log-probabilities) are not told apart:
    none."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or torch.Tag.dynamic_output_shape not in target.tags:
        return []
    if target is torch.ops.aten.index.Tensor:
        return [i for i in node.args[1] if isinstance(i, torch.fx.Node)
                and getattr(i.meta.get("val"), "dtype", None) == torch.bool]
    if target.overloadpacket is torch.ops.aten.masked_select:
        return [node.args[1]] if isinstance(node.args[1], torch.fx.Node) else []
    inputs = node.all_input_nodes
    return inputs if len(inputs) == 1 else []


def check_sizes_outlive_the_step(gm: torch.fx.GraphModule, model: nn.Module, mode: str,
                                 specialised: Sequence[str]) -> None:
    """Refuse a training joint graph (`trace_joint`'s, specialised on the example) whose forward sizes a
    tensor by values computed from the trainable parameters: an MoE's routing (DBRX's ``for expert_idx in
    expert_hit``, ``torch.where(expert_mask[expert_idx])``).  The graph holds the example's sizes, which
    the next optimizer step changes, so no plan of it runs as eager does.  A size read off the inputs
    alone (a label mask's count), or in inference, stays the example's, as
    `specialising_on_example_values` warns.  The error names the line (`specialised`'s for the operator
    where the node has no stack: a higher-order operator's body)."""
    if mode != "train":
        return
    kinds = dict(zip(gm.graph.find_nodes(op="placeholder"), _classify_placeholders(gm), strict=True))
    moving: set[torch.fx.Node] = {n for n, (kind, _) in kinds.items() if kind == "param"}
    for n in gm.graph.nodes:
        if n.op != "call_function" or is_backward(n):
            continue
        if any(a in moving for a in _sizing_inputs(n)):
            where = source_of(n) or next((r.split(": output shapes", 1)[0] for r in specialised
                                           if f"output shapes of {n.target} " in r), "")
            raise CaptureError(
                f"could not trace {type(model).__name__}: it sizes a tensor by values computed from its "
                f"parameters ({where}; an MoE's routing): the graph holds this example's sizes, which the "
                "next optimizer step changes, so no plan of it would train as eager does.  Route with fixed "
                "shapes (a Hugging Face MoE that offers it: experts_implementation='batched_mm'), or profile "
                "with mode='inference' (the parameters stay) or fallback=True (a module-level profile to "
                "read: memviz.export and memviz.apply cannot run its plans)",
                _module_of(n), where.split(" ", 1)[0])
        if any(a in moving for a in n.all_input_nodes):
            moving.add(n)


def check_specialised_as_eager(model: nn.Module, gm: torch.fx.GraphModule, args: tuple[Any, ...],
                               kwargs: dict[str, Any] | None, specialised: list[str],
                               traced_from: HostStates) -> None:
    """A graph specialised on the example's values must compute what eager computes on that example:
    run both forwards once (same RNG, no_grad) and refuse on any difference: a read the trace made
    that eager did not (or in another order) would otherwise give a silently wrong graph.  Eager runs
    with the host generators where the trace found them (`traced_from`): the graph holds the trace's
    draws from them as constants (SpecAugment's NumPy time masks in HF's wav2vec2 / HuBERT / WavLM),
    which eager draws again; they are warned about (`host_random_draws`), not a branch taken unlike eager."""
    leaves = _model_tensors(model, args, kwargs)
    outs = []
    # eager reads its uniform draws as the trace took them (`draws_at_their_top`)
    for fn, host in ((model, host_rng_at(traced_from)), (gm, contextlib.nullcontext())):
        with _forked_rng(leaves), torch.no_grad(), host, \
                draws_at_their_top() if fn is model else contextlib.nullcontext():
            outs.append([x for x in pytree.tree_leaves(fn(*args, **(kwargs or {})))
                         if isinstance(x, torch.Tensor)])
    same = len(outs[0]) == len(outs[1]) and all(
        a.shape == b.shape and a.dtype == b.dtype
        and torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True) for a, b in zip(*outs, strict=True))
    if not same:
        where = specialised[0].split(" ", 1)[0] if specialised else ""
        file, _, line = where.rpartition(":")
        module = _module_defined_at(model, file, int(line)) if line.isdigit() else ""
        raise CaptureError(
            f"could not trace {type(model).__name__}: its Python branches on tensor values could not be "
            f"fixed the way eager takes them on this example ({'; '.join(specialised)}); memviz cannot "
            "plan this model as written: make the branch independent of tensor values (a flag, torch.where)",
            module, where)


def _symbolic_scalar(node: torch.fx.Node) -> bool:
    """Whether `node` yields a Python number read off a tensor's value (``.item()``, and arithmetic on it)."""
    val = node.meta.get("val")
    return isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat))


_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
_VALUE_CHECKS = (torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range_for_size.default,
                 torch.ops.aten.sym_constrain_range.default)


def drop_value_checks(gm: torch.fx.GraphModule) -> None:
    """Remove the runtime assertions of the branches a trace took on tensor values and the scalar reads
    (``.item()``) only they use, with the tensor ops only those read (HF's ``labels.max() >= vocab``).

    They are the branches `specialising_on_example_values` fixed: the graph holds only the way the
    example input went, and the AOT joint trace, with static shapes, could not read a value again.
    Random ops stay (LayerDrop's ``torch.rand([])``): eager draws them, so the random stream after them
    (dropout masks) stays eager's.  The graphs of higher-order operators (a ``torch.no_grad()`` block's
    ``wrap_with_set_grad_enabled``) too: DBRX reads its expert index in one."""
    for sub in gm.modules():
        if isinstance(sub, torch.fx.GraphModule):
            _drop_value_checks(sub)


def _drop_value_checks(gm: torch.fx.GraphModule) -> None:
    """`drop_value_checks` in one graph, not the graphs it calls."""
    graph = gm.graph
    for n in graph.nodes:
        # sizes export left symbolic (``masked_select``): the joint trace, static, takes the example's
        n.meta.pop("unbacked_bindings", None)
    # a read whose number the trace took as eager's (an expert loop's ``w[e]``) is used by no node; the
    # ops before it stay: eager runs them, and each pass over the graph makes eager's sized calls in order
    for n in [n for n in graph.nodes if n.op == "call_function" and n.target in _READS and not n.users
              and not _symbolic_scalar(n)]:
        graph.erase_node(n)
    checks = [n for n in graph.nodes if n.op == "call_function" and (
        n.target in _VALUE_CHECKS or _symbolic_scalar(n))]
    if not checks:
        gm.recompile()
        return
    pending, erased = list(checks), set()
    while pending:
        n = pending.pop()
        if n in erased or n.users or (n not in checks and n.is_impure()):
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        erased.add(n)
        pending.extend(a for a in inputs if a.op == "call_function")
    gm.recompile()


@contextlib.contextmanager
def unchanging_module_to() -> Iterator[None]:
    """``module.to(dtype)`` inside a forward (Switch Transformers' router: ``self.classifier =
    self.classifier.to(self.dtype)``) applies the conversion to every parameter; under export they are
    fake, and ``_apply`` cannot swap them (``Couldn't swap Linear.weight``).  Eager changes nothing when
    every floating-point tensor already has that dtype and device, and so does the trace: the call
    returns the module.  A real conversion still goes to ``nn.Module.to``."""
    to = nn.Module.to

    def unchanged(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if memory_format is None and all(
                (dtype is None or t.dtype == dtype or not (t.is_floating_point() or t.is_complex()))
                and (device is None or t.device == device)
                for t in (*module.parameters(), *module.buffers())):
            return module
        return to(module, *args, **kwargs)

    with unittest.mock.patch.object(nn.Module, "to", unchanged):
        yield


@contextlib.contextmanager
def formatted_as_eager() -> Iterator[None]:
    """``f"{t}"`` of a 0-d tensor as eager formats it: its value (``Tensor.__format__`` reads ``item()``
    only for a plain ``Tensor``; a traced one is a FakeTensor, formatted as its repr).  Switch
    Transformers picks its expert module by name, ``self[f"expert_{expert_idx[0]}"]``.  The read is a
    value read like any other: specialised on eager's (`specialising_on_example_values`)."""
    from torch._subclasses.fake_tensor import FakeTensor

    fmt = torch.Tensor.__format__

    def formatted(t: torch.Tensor, spec: str) -> str:
        if not (isinstance(t, FakeTensor) and t.dim() == 0):
            return fmt(t, spec)
        value = t.item()
        # a symbol read off a value (the first trace) formats as its name: asking for the number stops
        # the trace as data-dependent, and the next one takes eager's
        plain = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}.get(type(value))
        return format(plain(value) if plain else value, spec)

    with unittest.mock.patch.object(torch.Tensor, "__format__", formatted):
        yield


@contextlib.contextmanager
def _quiet_data_dependent_logs() -> Iterator[None]:
    """torch logs the whole graph at WARNING before raising a data-dependent error; memviz handles the
    error (`specialising_on_example_values`) and says what it did instead."""
    import logging

    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _trace_joint(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, mode: str,
                 loss_fn: LossFn | None, functions: Any, specialising: Any,
                 specialised: list[str] | None = None, family: str | None = None
                 ) -> tuple[torch.fx.GraphModule, pytree.TreeSpec, dict[int, OutputView]]:
    """`trace_joint`'s two traces (export, then AOT joint) inside `specialising` (a context)."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    with specialising, rnn_decomposed_in_trace(mode == "train"):
        traced_from = host_rng_states()
        try:
            with functions, unchanging_module_to(), formatted_as_eager():
                ep = _export(model, args, kwargs)
        except Exception as err:  # noqa: BLE001 - every export failure becomes a CaptureError
            raise _describe_trace_error(err, model) from err
        gm_ep = ep.module()
        drop_value_checks(gm_ep)
        if specialised is not None:
            check_specialised_as_eager(model, gm_ep, args, kwargs, specialised, traced_from)
        use_eager_kernels(gm_ep, family)
        if mode == "train":
            detach_outputs(gm_ep, unused_outputs(gm_ep, ep.call_spec.out_spec, loss_fn))
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(eager_kernels_in_trace())
                stack.enter_context(eager_cpu_dropout_in_trace(family == "cpu"))
                stack.enter_context(cpu_batch_norm_layouts_in_trace(family == "cpu"))
                stack.enter_context(cuda_attention_in_trace(family))
                joint = aot_export_joint_with_descriptors(
                    stack, gm_ep, tuple(args), kwargs or {}, _record_nn_module_stack=True)
        except Exception as err:  # noqa: BLE001
            raise _describe_trace_error(err, model) from err
    views = aliased_outputs(joint, gm_ep, model) if mode == "train" else {}
    joint.graph_module.meta["memviz_call_args"] = call_arguments(joint.graph_module)
    return joint.graph_module, ep.call_spec.out_spec, views


@dataclass(frozen=True)
class OutputView:
    """An output AOTAutograd gives no tangent because it is a view of something else, and how to rebuild it.

    ``base`` is ``("output", flat_index)``, ``("param", fqn)``, ``("buffer", fqn)`` or ``("input",
    flat_index)``; ``chain`` names the FX view ops of the joint graph that lead from the base to the
    output (empty: the output is the input itself).  This is AOTAutograd's own treatment of aliased
    outputs (``OutputType.alias_of_input`` / ``alias_of_intermediate_base_is_user_output`` / ``is_input``,
    regenerated by ``gen_alias_from_base`` in ``_aot_autograd/runtime_wrappers.py``): the exported module
    replays the view on the real base outside the planned Function, so autograd carries the gradient the
    loss sends through the view into the base (the base output's gradient, or the parameter's).
    """

    base: tuple[str, Any]
    chain: tuple[str, ...]

    def base_value(self, outputs: Sequence[Any], params: dict[str, Any], buffers: dict[str, Any],
                   inputs: Sequence[Any]) -> Any:
        """The value `base` names among a step's outputs, the model's parameters and buffers (by
        fully qualified name, duplicates included) and the flat inputs."""
        kind, key = self.base
        return {"output": outputs, "param": params, "buffer": buffers, "input": inputs}[kind][key]


def replay_view(view: OutputView, nodes: dict[str, torch.fx.Node], base: Any) -> Any:
    """`view`'s ops run on `base` (a real tensor under autograd, or a fake one): the aliased output."""
    out = base
    for name in view.chain:
        node = nodes[name]
        prev = node.args[0]
        args = torch.fx.node.map_arg(node.args, lambda a, prev=prev, out=out: out if a is prev else a)
        out = node.target(*args, **node.kwargs)
    return out


def with_output_views(cap: Captured, leaves: list[Any]) -> list[Any]:
    """`leaves` (the flat outputs handed to the loss) with each output that views another output rebuilt
    as that view of it, so the loss's gradient through it reaches the base output's gradient."""
    nodes = cap.nodes
    out = list(leaves)
    for i, view in cap.output_views.items():
        if view.base[0] == "output":
            out[i] = replay_view(view, nodes, out[view.base[1]])
    return out


def aliased_outputs(joint: Any, gm_ep: torch.fx.GraphModule, model: nn.Module) -> dict[int, OutputView]:
    """The outputs AOTAutograd gives no tangent of their own because they alias another output, an
    input or a parameter (``g[:, :3]`` next to ``g``, ``x.transpose(0, 1)``, ``self.w.t()``), each with
    its base and the chain of view ops from the base (`OutputView`).

    AOTAutograd's runtime wrapper regenerates such an output from its base so that autograd carries its
    gradient to the base; memviz runs the joint graph itself and does the same (`memviz.export`).  Two
    views of one intermediate that is not an output (``OutputType.alias_of_intermediate``: AOTAutograd
    adds the intermediate as a hidden output with its own tangent), a custom Function's view, and a view
    reached other than by a chain of view ops from its base are refused: a `CaptureError` naming the
    line and saying to ``.clone()`` the output (the gradient through it would be lost silently)."""
    from torch._functorch._aot_autograd import descriptors as D
    from torch._functorch._aot_autograd.schemas import OutputType

    meta = joint._aot_state.fw_metadata
    graph = joint.graph_module.graph
    placeholders = graph.find_nodes(op="placeholder")
    tangents = {n.meta["desc"].output.idx for n in placeholders
                if isinstance(n.meta.get("desc"), D.TangentAOTInput)
                and isinstance(n.meta["desc"].output, D.PlainAOTOutput)}
    out_node = graph.output_node()
    by_idx = {d.idx: a for a, d in zip(pytree.tree_leaves(out_node.args[0], is_leaf=lambda x: x is None),
                                       out_node.meta.get("desc") or [], strict=False)
              if isinstance(d, D.PlainAOTOutput)}
    user_outs = pytree.tree_leaves(gm_ep.graph.output_node().args[0], is_leaf=lambda x: x is None)
    replayable = (OutputType.alias_of_input, OutputType.is_input,
                  OutputType.alias_of_intermediate_base_is_user_output)
    views: dict[int, OutputView] = {}
    for i, info in enumerate(meta.output_info):
        if i in tangents or info.output_type in (OutputType.non_alias, OutputType.unsafe_view_alias):
            continue
        node = by_idx.get(i)
        why = f"a view ({info.output_type.name}) of an intermediate value two outputs share"
        if info.output_type in replayable and isinstance(node, torch.fx.Node):
            if info.output_type is OutputType.alias_of_intermediate_base_is_user_output:
                base_key: tuple[str, Any] = ("output", info.base_idx)
                base_node = by_idx.get(info.base_idx)
            else:
                base_node = placeholders[info.base_idx]
                desc = base_node.meta.get("desc")
                base_key = (("param", desc.target) if isinstance(desc, D.ParamAOTInput) else
                            ("buffer", desc.target) if isinstance(desc, D.BufferAOTInput) else
                            ("input", desc.idx) if isinstance(desc, D.PlainAOTInput) else ("?", None))
            chain = _view_chain(node, base_node)
            if chain is not None and base_key[0] != "?":
                views[i] = OutputView(base_key, chain)
                continue
            why = f"a view ({info.output_type.name}) memviz cannot replay from its base"
        if not info.requires_grad:
            continue
        user = user_outs[i] if i < len(user_outs) else None
        where = user if isinstance(user, torch.fx.Node) else node
        raise CaptureError(f"output {i} of {type(model).__name__} is {why}: memviz would drop the gradient "
                           "the loss sends through it; return a .clone() of it, or leave it out of the loss",
                           (_module_of(where) if where is not None else "") or type(model).__name__,
                           source_of(where) if where is not None else "")
    return views


def _view_chain(node: torch.fx.Node, base: torch.fx.Node | None) -> tuple[str, ...] | None:
    """Names of the view ops leading from `base` to `node` (each one's first argument the previous,
    no other graph value among its arguments), or None when `node` is not reached that way."""
    chain: list[str] = []
    while node is not base:
        if (base is None or node.op != "call_function" or not getattr(node.target, "is_view", False)
                or not node.args or not isinstance(node.args[0], torch.fx.Node)
                or len(node.all_input_nodes) != 1):
            return None
        chain.append(node.name)
        node = node.args[0]
    return tuple(reversed(chain))


def _classify_placeholders(gm: torch.fx.GraphModule) -> list[tuple[str, Any]]:
    from torch._functorch._aot_autograd import descriptors as D

    kinds: list[tuple[str, Any]] = []
    for n in gm.graph.find_nodes(op="placeholder"):
        desc = n.meta.get("desc")
        if isinstance(desc, D.ParamAOTInput):
            kinds.append(("param", desc.target))
        elif isinstance(desc, D.BufferAOTInput):
            kinds.append(("buffer", desc.target))
        elif isinstance(desc, D.PlainAOTInput):
            kinds.append(("input", desc.idx))
        elif isinstance(desc, D.TangentAOTInput) and isinstance(desc.output, D.PlainAOTOutput):
            kinds.append(("tangent", desc.output.idx))
        else:
            raise CaptureError(f"unsupported graph input {desc!r} (tensor subclasses, RNG functionalization "
                               "and mutated views of inputs are not supported)")
    return kinds


def _classify_outputs(gm: torch.fx.GraphModule) -> tuple[list[Any], list[tuple[str, Any] | None]]:
    from torch._functorch._aot_autograd import descriptors as D

    out_node = gm.graph.output_node()
    args = list(pytree.tree_leaves(out_node.args[0], is_leaf=lambda x: x is None))
    descs = out_node.meta.get("desc") or [None] * len(args)
    kinds: list[tuple[str, Any] | None] = []
    for a, desc in zip(args, descs, strict=False):
        if a is None:
            kinds.append(None)
        elif isinstance(desc, D.PlainAOTOutput):
            kinds.append(("user", desc.idx))
        elif isinstance(desc, D.GradAOTOutput) and isinstance(desc.grad_of, D.ParamAOTInput):
            kinds.append(("grad", desc.grad_of.target))
        elif isinstance(desc, D.InputMutationAOTOutput) and isinstance(desc.mutated_input, D.BufferAOTInput):
            kinds.append(("buffer", desc.mutated_input.target))
        elif isinstance(desc, D.GradAOTOutput) and isinstance(desc.grad_of, D.PlainAOTInput):
            kinds.append(("input_grad", desc.grad_of.idx))  # an input that requires grad
        else:
            raise CaptureError(f"unsupported graph output {desc!r}: the model mutates an input or returns an "
                               "alias memviz cannot replay; clone it inside forward()")
    return args, kinds


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


@dataclass(frozen=True)
class LossMemory:
    """What the user's loss holds, measured by `loss_memory` (bytes).

    ``loss``: the loss tensor's storage (more than its one element when a kernel returns a view of a
    larger buffer: CPU ``mse_loss``); ``tangents``: flat output index -> its gradient's new bytes;
    ``view_grads``: what the loss sends through aliased outputs into parameters and inputs; ``saved``:
    what the loss's autograd graph keeps from its forward until its backward (cross-entropy's
    log-probabilities, MSE's target); ``forward_temp`` / ``backward_temp``: the transient peak of the
    loss's forward beyond the loss and ``saved``, and of its backward beyond the gradients it returns."""

    loss: int = 0
    tangents: dict[int, int] = field(default_factory=dict)
    view_grads: int = 0
    saved: int = 0
    forward_temp: int = 0
    backward_temp: int = 0
    loss_grad: int = 0  # the ones ``loss.backward()`` starts from
    # flat output indices whose storage the loss's autograd graph keeps until its backward (MSE saves its
    # input): eager frees every other output once the loss returns and the user drops it
    saved_outputs: frozenset[int] = frozenset()
    # eager releases an output the loss saved inside the loss's backward, once the autograd node that
    # saved it has run: (flat output indices released before the phase, peak above the backward's start
    # in it) per phase between such releases, and the bytes of the gradients the backward returns
    backward_phases: tuple[tuple[frozenset[int], int], ...] = ()
    backward_returned: int = 0


def loss_memory(tangents: dict[int, torch.fx.Node], out_vals: dict[int, torch.Tensor],
                out_spec: pytree.TreeSpec, n_out: int, loss_fn: LossFn | None,
                views: dict[int, OutputView] | None = None, nodes: dict[str, torch.fx.Node] | None = None,
                bases: dict[tuple[str, Any], torch.Tensor] | None = None, *,
                real: bool = False, preexisting: Sequence[torch.Tensor] = ()) -> LossMemory:
    """The bytes `loss_fn` and its backward hold (`LossMemory`), measured by running both on tensors of
    the outputs' shapes: autograd decides what the loss keeps, as in the eager step, not a table.

    By default on fake tensors under a fake-storage `StorageTracker` (no memory, no compute: what
    `capture` can always afford).  ``real=True`` runs it on real tensors on the outputs' device (the live
    storages on CPU, the caching allocator on an accelerator): a kernel's own storage choices show
    there only (CPU ``mse_loss`` returns its mean as a view of an input-sized buffer, so the loss holds
    that much until the step ends); `memviz.profile` does this on a device it measures, passing the
    model's parameters, buffers and inputs as `preexisting` (a loss reading the labels the model also
    takes must not count them as its own).

    ``loss.backward()`` holds the loss's own gradient (ones) for the whole backward: `capture` gives it a
    data node of the loss's size, so an output gradient on that storage (``sum`` gives an expanded view
    of it) or on one an earlier output gradient already counts costs nothing more.

    An aliased output is built as its view of its base, as the exported module builds it, so the
    gradient through it lands in its base's: a full-size gradient for an output whose view the loss
    also reads (``sum`` alone would hand it an expanded scalar).  `bases` holds a tensor per
    parameter/input/buffer base (requiring grad as the real one does); the gradient reaching such a base
    waits in autograd until the exported backward returns that base's own gradient, and is then added to
    it: ``view_grads`` counts it, plus for a parameter one tensor of its size (autograd's input buffer
    adds in place only into a gradient that is not a view; a Linear weight's planned gradient is
    ``t(t(mm))``).  Measured on the zoo's ``param_view`` the exported step peaks 512 B (3.6%) under
    this count: an over-estimate, never under; an input's view is exact."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    views, nodes, bases = views or {}, nodes or {}, bases or {}
    context = contextlib.nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True)
    with context, torch.enable_grad():
        flat: list[Any] = [None] * n_out
        for i in range(n_out):
            v = out_vals.get(i)
            if i in views or not isinstance(v, torch.Tensor):  # a constant output is passed as itself
                flat[i] = v
                continue
            flat[i] = _like(v, real).requires_grad_(i in tangents)
        own_bases = {k: _like(b, real).requires_grad_(b.requires_grad) for k, b in bases.items()}
        for i, view in views.items():
            base = flat[view.base[1]] if view.base[0] == "output" else own_bases[view.base]
            flat[i] = replay_view(view, nodes, base)
        return _measure_loss(flat, own_bases, sorted(tangents), out_spec, loss_fn or default_loss, real,
                             preexisting)


def _like(v: torch.Tensor, real: bool) -> torch.Tensor:
    """A tensor of `v`'s shape, strides, dtype and device: real values when `real` (random in [0, 1):
    finite, and valid probabilities for a loss such as binary cross-entropy), else fake (inside the
    caller's FakeTensorMode)."""
    t = torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=v.device)
    with torch.no_grad():
        if real and (t.is_floating_point() or t.is_complex()):
            t.uniform_()
        elif real:
            t.zero_()
    return t


def _measure_loss(flat: list[Any], bases: dict[tuple[str, Any], torch.Tensor], diff_idx: list[int],
                  out_spec: pytree.TreeSpec, loss_fn: LossFn, real: bool,
                  preexisting: Sequence[torch.Tensor] = ()) -> LossMemory:
    """`loss_memory` on the prepared outputs `flat` and `bases`."""
    from memviz.profiling.tracker import memory_meter

    device = next((x.device for x in flat if isinstance(x, torch.Tensor)), torch.device("cpu"))
    # the outputs and bases exist before the loss runs: only what the loss creates counts
    meter = memory_meter([x for x in (*flat, *bases.values(), *preexisting) if isinstance(x, torch.Tensor)],
                         fake=not real, device=device)
    start = meter.mark()
    saved_keys: set[int] = set()
    outputs = {_storage_key(x) for x in flat if isinstance(x, torch.Tensor)}
    releases = _Releases(meter)

    def pack(t: torch.Tensor) -> Any:
        key = _storage_key(t)
        saved_keys.add(key)
        return releases.hold(t, key) if key in outputs else t

    with meter, torch.autograd.graph.saved_tensors_hooks(pack, _Releases.unpack):
        loss = _scalar_loss(loss_fn(pytree.tree_unflatten(flat, out_spec)))
    saved_outputs = frozenset(i for i, x in enumerate(flat)
                              if isinstance(x, torch.Tensor) and _storage_key(x) in saved_keys)
    # alive after the loss returns, besides the loss: what its autograd graph saved for backward
    loss_new = storage_nbytes(loss) if meter.counted_since(loss, start) else 0
    kept = meter.live_bytes - meter.start_bytes
    saved = max(0, kept - loss_new)
    forward_temp = max(0, meter.peak_bytes - meter.start_bytes - kept)
    diff = [flat[i] for i in diff_idx]
    leaf_bases = [k for k in sorted(bases, key=str) if bases[k].requires_grad]
    root = torch.ones_like(loss)
    meter.add(root)
    before, mark = meter.live_bytes, meter.mark()
    meter.reset_peak()
    releases.start(before)
    with meter:
        grads = torch.autograd.grad(loss, [*diff, *(bases[k] for k in leaf_bases)], grad_outputs=root,
                                    allow_unused=True)
    phases = releases.finish()
    # the gradients it returns are the node's outputs (data nodes); the rest of its peak is workspace
    returned = sum({_storage_key(g): storage_nbytes(g) for g in grads
                    if g is not None and meter.counted_since(g, mark)}.values())
    backward_temp = max(0, max(peak for _, peak in phases) - returned)
    by_key = {k: frozenset(i for i, x in enumerate(flat)
                           if isinstance(x, torch.Tensor) and _storage_key(x) in k) for k, _ in phases}
    counted = {_storage_key(root)}
    sizes = {}
    for i, g in zip(diff_idx, grads, strict=False):
        if g is None:  # unused output: `memviz.export` hands its backward one zero, expanded
            sizes[i] = flat[i].element_size()
            continue
        sizes[i] = 0 if _storage_key(g) in counted else storage_nbytes(g)
        counted.add(_storage_key(g))
    held = 0
    for k, g in zip(leaf_bases, grads[len(diff):], strict=True):
        if g is None:
            continue
        held += 0 if _storage_key(g) in counted else storage_nbytes(g)
        if k[0] == "param":  # the planned gradient is a view (t(t(mm))): added into a new tensor
            held += storage_nbytes(bases[k])
        counted.add(_storage_key(g))
    return LossMemory(storage_nbytes(loss), sizes, held, saved, forward_temp, backward_temp,
                      storage_nbytes(root), saved_outputs,
                      tuple((by_key[k], peak) for k, peak in phases) if len(phases) > 1 else (), returned)


class _Saved:
    """A reference autograd saved to one of the loss's inputs (the model's outputs), boxed so that its
    release, when the node that saved it has run, can be seen (`_Releases`)."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _Releases:
    """When the loss's backward drops its last saved reference to each output (eager frees that output
    there when only the loss held it), and the peak of each phase between such drops."""

    def __init__(self, meter: Any) -> None:
        self.meter, self.refs = meter, {}
        self.released: frozenset[int] = frozenset()
        self.phases: list[tuple[frozenset[int], int]] = []
        self.before: int | None = None

    def hold(self, tensor: torch.Tensor, key: int) -> _Saved:
        box = _Saved(tensor)
        self.refs[key] = self.refs.get(key, 0) + 1
        weakref.finalize(box, self._dropped, key).atexit = False
        return box

    @staticmethod
    def unpack(x: Any) -> Any:
        return x.tensor if isinstance(x, _Saved) else x

    def start(self, before: int) -> None:
        self.before = before

    def _dropped(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] or self.before is None:
            return
        self.phases.append((self.released, _peak_now(self.meter) - self.before))
        self.released |= {key}
        self.meter.reset_peak()

    def finish(self) -> list[tuple[frozenset[int], int]]:
        phases = [*self.phases, (self.released, _peak_now(self.meter) - (self.before or 0))]
        self.before = None
        return phases


def _peak_now(meter: Any) -> int:
    """The meter's peak so far, inside its run (an allocator meter reads the device's statistic)."""
    current = getattr(meter, "current_peak", None)
    return current() if current is not None else meter.peak_bytes


def with_loss_memory(graph: Graph, cap: Captured, lmem: LossMemory) -> Graph:
    """`graph` with the loss's bytes (the loss, what it saves, its gradient) and its two nodes'
    transient bytes set to `lmem` (a measurement on the device, `loss_memory(real=True)`)."""
    if cap.loss_compute is None or cap.loss_backward_compute is None:
        return graph
    fwd, bwd = graph.computes[cap.loss_compute], graph.computes[cap.loss_backward_compute]
    sizes = {fwd.outputs[0]: lmem.loss, fwd.outputs[1]: lmem.saved, bwd.outputs[-1]: lmem.loss_grad}
    temps = {fwd.id: lmem.forward_temp, bwd.id: lmem.backward_temp}
    datas = tuple(dataclasses.replace(d, bytes=sizes[d.id]) if d.id in sizes else d for d in graph.datas)
    computes = tuple(dataclasses.replace(c, temp_bytes=temps[c.id]) if c.id in temps else c
                     for c in graph.computes)
    meta = {k: v for k, v in graph.meta.items() if k != "eager_loss_backward_temp"}
    eager = _eager_loss_backward_temp(graph, cap, lmem)
    if eager != lmem.backward_temp:
        meta["eager_loss_backward_temp"] = eager
    return Graph(computes, datas, graph.outputs, name=graph.name, meta=meta)


def _eager_loss_backward_temp(graph: Graph, cap: Captured, lmem: LossMemory) -> int:
    """The loss backward's workspace as eager runs it: an output the loss saved is released inside
    the loss's backward, once the autograd node that saved it has run (`LossMemory.backward_phases`),
    when nothing else holds it (no other node reads it, it is no graph output).  The backward's peak
    is then the largest of its phases, each less the outputs released before it (the chunked
    cross-entropy of a shifted view, ``logits[:, :-1]``, frees the logits before ``SliceBackward``
    builds their full-size gradient).  The exported module's step holds its outputs until its own
    backward starts, so plans keep `lmem.backward_temp`; `summed_as_eager` puts this one in the eager
    graph."""
    if not lmem.backward_phases:  # nothing the loss saved was released inside its backward
        return lmem.backward_temp
    bwd = graph.computes[cap.loss_backward_compute]
    loss_nodes = {cap.loss_compute, cap.loss_backward_compute}
    alone = {d for d in bwd.inputs if d not in graph.outputs and set(graph.consumers(d)) <= loss_nodes}
    views = cap.output_views
    best = 0
    for released, peak in lmem.backward_phases:
        bases = {views[i].base[1] if i in views else i for i in released
                 if i not in views or views[i].base[0] == "output"}
        freed = {cap.output_data[i] for i in bases if cap.output_data.get(i) in alone}
        best = max(best, peak - sum(graph.datas[d].bytes for d in freed))
    return max(0, best - lmem.backward_returned)


class _Builder:
    """Walks the joint FX graph once, creating compute nodes, data nodes and the FX <-> data maps."""

    def __init__(self, name: str) -> None:
        self.b = GraphBuilder(name)
        self.data_of_storage: dict[int, int] = {}
        self.data_of_fx: dict[str, int] = {}
        self.data_fx: list[str | None] = []
        self.data_bytes: list[int] = []
        self.aliases: list[list[str]] = []
        self.elem_data: dict[tuple[str, int], int] = {}
        self.compute_fx: list[str | None] = []
        self.elem_fx: dict[str, list[tuple[int, str]]] = {}
        self.reads_instead: dict[str, str] = {}  # `Captured.reads_instead`

    def data(self, name: str, nbytes: int, kind: DataKind, fx_name: str | None, shape: tuple[int, ...],
             dtype: str) -> int:
        d = self.b.data(name, nbytes, kind, shape=shape, dtype=dtype)
        self.data_fx.append(fx_name)
        self.data_bytes.append(nbytes)
        self.aliases.append([])
        return d

    def tensor_data(self, name: str, t: torch.Tensor, kind: DataKind, fx_name: str | None,
                    nbytes: int | None = None) -> int:
        """`nbytes`: what the real kernel allocates, where the fake tensor's storage is not that."""
        nbytes = storage_nbytes(t) if nbytes is None else nbytes
        d = self.data(name, nbytes, kind, fx_name, tuple(t.shape), _dtype_name(t))
        self.data_of_storage[_storage_key(t)] = d
        return d

    def inputs_of(self, node: torch.fx.Node) -> list[int]:
        """Data nodes a node reads, looking through nodes that own no storage (shape queries ...)."""
        found: set[int] = set()
        stack = list(node.all_input_nodes)
        while stack:
            a = stack.pop()
            if a.name in self.reads_instead:
                found.add(self.data_of_fx[self.reads_instead[a.name]])
            elif a.name in self.data_of_fx:
                found.add(self.data_of_fx[a.name])
            elif a.op == "call_function":
                stack.extend(a.all_input_nodes)
        return sorted(found)

    def real_nbytes(self, n: torch.fx.Node) -> int | None:
        """The bytes `n`'s real kernel allocates where its fake tensor's storage differs (None elsewhere):
        a `STORAGE_CLONING_SCATTERS` output holds as much as the storage it writes into."""
        if n.target not in STORAGE_CLONING_SCATTERS or not isinstance(n.args[0], torch.fx.Node):
            return None
        into = n.args[0].meta.get("val")
        d = self.data_of_storage.get(_storage_key(into)) if isinstance(into, torch.Tensor) else None
        return None if d is None else self.data_bytes[d]

    def op_node(self, n: torch.fx.Node, phase: Phase) -> None:
        val = n.meta.get("val")
        if n.target is operator.getitem and (n.args[0].name, n.args[1]) in self.elem_data:
            d = self.elem_data[(n.args[0].name, n.args[1])]
            self.data_of_fx[n.name] = d
            if self.data_fx[d] is None:
                self.data_fx[d] = n.name
                self.elem_fx.setdefault(n.args[0].name, []).append((n.args[1], n.name))
            else:
                self.aliases[d].append(n.name)
            return
        leaves = _tensor_leaves(val)
        tensors = [t for t in leaves if t is not None]
        if not tensors:
            return  # no tensor result (asserts, shape queries): replayed on demand, costs nothing
        fresh = [t for t in tensors if _storage_key(t) not in self.data_of_storage]
        if not fresh:  # a view of (or in-place result on) an existing storage: merged into it
            d = self.data_of_storage[_storage_key(tensors[0])]
            self.data_of_fx[n.name] = d
            self.aliases[d].append(n.name)
            return
        is_tuple = isinstance(val, (tuple, list))
        kind = DataKind.ACTIVATION if phase is Phase.FORWARD else DataKind.GRADIENT
        outs = []
        for i, t in enumerate(leaves):
            if t is None or _storage_key(t) in self.data_of_storage:
                continue
            name = f"{n.name}[{i}]" if is_tuple else n.name
            d = self.tensor_data(name, t, kind, None if is_tuple else n.name, self.real_nbytes(n))
            if is_tuple:
                self.elem_data[(n.name, i)] = d
            else:
                self.data_of_fx[n.name] = d
            outs.append(d)
        self.b.compute(n.name, self.inputs_of(n), outs, op=_op_name(n), phase=phase, module=_module_of(n),
                       source=source_of(n))
        self.compute_fx.append(n.name)


def op_key(target: Any, args: Any, kwargs: Any) -> tuple[Any, ...] | None:
    """What an operator's cost depends on: the op and every argument's shape, stride, dtype and device
    (other arguments by value).  Identical keys share one measurement (the 12 blocks of a GPT run the
    same kernels on the same shapes).  None when an argument has no stable description."""
    parts: list[Any] = [target]
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            if any(isinstance(s, torch.SymInt) for s in (*leaf.shape, *leaf.stride())):
                return None  # a symbolic size is not a stable description
            parts.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device.type))
        elif leaf is None or isinstance(leaf, (bool, int, float, str, torch.dtype, torch.device,
                                               torch.layout, torch.memory_format)):
            parts.append(leaf)
        else:
            return None
    return tuple(parts)


def _unsafe_name(name: str) -> bool:
    """FX writes module, parameter and buffer names into the graph module's Python source as string
    literals without escaping them: a double quote, a backslash, a line break or a NUL there is a raw
    SyntaxError (or another attribute) deep in torch.export.  Refused with the other quote and every
    non-printable character, which no generated source should have to carry either."""
    return any(ch in "\"'\\" for ch in name) or not name.isprintable()


def check_names(model: nn.Module) -> None:
    """Refuse, naming it, a submodule, parameter or buffer name the trace cannot write into code."""
    for kind, named in (("submodule", model.named_modules(remove_duplicate=False)),
                        ("parameter", model.named_parameters(remove_duplicate=False)),
                        ("buffer", model.named_buffers(remove_duplicate=False))):
        for name, _ in named:
            if _unsafe_name(name):
                raise CaptureError(f"{kind} name {name!r} has a quote, a backslash or a non-printable "
                                   "character (line break, tab, NUL ...), which the traced graph's generated "
                                   "code cannot hold: rename it (add_module / register_parameter / "
                                   "register_buffer with a plain name) and profile again")



def shared_inputs(flat: list[Any]) -> dict[int, int]:
    """Flat input index -> the first index holding the same tensor object, for every later repeat."""
    first: dict[int, int] = {}
    shared = {}
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            j = first.setdefault(id(x), i)
            if j != i:
                shared[i] = j
    return shared

def capture(model: nn.Module, args: Sequence[Any], kwargs: dict[str, Any] | None = None, *,
            mode: str = "train", loss_fn: LossFn | None = None,
            kernels: str | None = None) -> tuple[Graph, Captured]:
    """Trace `model` and build its CD-graph (compute/data nodes, kinds, exact bytes, aliases).

    Training graphs hold forward, the synthetic ``loss``/``loss_backward`` pair, and backward;
    inference graphs the forward only.  Kinds: parameters (tied ones: one node), buffers, inputs,
    activations (``saved`` when a backward node reads them), gradients, parameter gradients, outputs
    (model outputs, the loss, the new values of mutated buffers).  `kernels` (``"cuda"`` / ``"cpu"``,
    default: the tensors' device) names whose kernel choices the graph holds (`kernel_family`): a profile
    estimated for a CUDA target on a CPU host passes ``"cuda"``.
    """
    if mode not in ("train", "inference"):
        raise ValueError(f"mode must be 'train' or 'inference', not {mode!r}")
    check_names(model)
    # Fake tensors' dispatch cache (process-wide) rebuilds a cached op's output with the smallest storage
    # its strides need, not the storage the kernel allocates: bytes would depend on what was traced
    # before (an in-place view's gradient read 768 bytes in the first capture, 648 in the next)
    with torch._dynamo.config.patch(fake_tensor_cache_enabled=False):
        return _capture(model, tuple(args), kwargs, mode, loss_fn, kernel_family(kernels, args, model))


def _capture(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, mode: str,
             loss_fn: LossFn | None, family: str | None) -> tuple[Graph, Captured]:
    flat_in, in_spec = pytree.tree_flatten((args, kwargs or {}))
    gm, out_spec, views, specialised, drawn, host_random, torch_draws, kept, cycled = traced_as_eager_draws(
        model, args, kwargs, mode, loss_fn, family)
    ph_kinds = _classify_placeholders(gm)
    out_args, out_kinds = _classify_outputs(gm)
    # outputs a reference cycle holds past the step's loss: eager holds them as it holds kept state
    kept += tuple(a.name for a, kind in zip(out_args, out_kinds, strict=True)
                  if kind is not None and kind[0] == "user" and kind[1] in cycled and a.name not in kept)

    canonical: dict[int, str] = {}
    param_names = {name: canonical.setdefault(id(p), name)
                   for name, p in model.named_parameters(remove_duplicate=False)}
    bld = _Builder(type(model).__name__)

    # sources: parameters (tied ones share one data node), buffers, inputs; tangents come later
    param_data: dict[str, int] = {}
    tangents: dict[int, torch.fx.Node] = {}
    for n, (kind, key) in zip(gm.graph.find_nodes(op="placeholder"), ph_kinds, strict=False):
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue  # a non-tensor input (int, float, None): specialised into the graph, no storage
        if kind == "tangent":
            tangents[key] = n
            continue
        if kind == "param" and param_names.get(key, key) in param_data:
            d = param_data[param_names[key]]
            bld.aliases[d].append(key)
            bld.data_of_storage[_storage_key(val)] = d
        elif kind == "param":
            d = param_data[param_names.get(key, key)] = bld.tensor_data(
                param_names.get(key, key), val, DataKind.PARAMETER, n.name)
        elif kind == "buffer":
            d = bld.tensor_data(key, val, DataKind.BUFFER, n.name)
        else:
            d = bld.tensor_data(f"input{key}", val, DataKind.INPUT, n.name)
        bld.data_of_fx[n.name] = d

    n_out = 1 + max((k[1] for k in out_kinds if k and k[0] == "user"), default=-1)
    out_vals = {k[1]: a.meta["val"] if isinstance(a, torch.fx.Node) else a
                for a, k in zip(out_args, out_kinds, strict=True) if k and k[0] == "user"}
    # the real parameters and inputs views are taken of: their requires_grad decides the gradient
    params_all = dict(model.named_parameters(remove_duplicate=False))
    buffers_all = dict(model.named_buffers(remove_duplicate=False))
    base_vals = {v.base: v.base_value((), params_all, buffers_all, flat_in)
                 for v in views.values() if v.base[0] != "output"}
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    probe = functools.partial(loss_memory, tangents, out_vals, out_spec, n_out, loss_fn, views, fx_nodes,
                              base_vals)
    lmem = probe() if tangents or views else LossMemory()
    regions = accelerator.autocast_regions()
    captured = Captured(
        gm=gm, mode=mode, placeholders=ph_kinds, outputs=out_kinds, compute_fx=bld.compute_fx,
        data_fx=bld.data_fx, data_of_fx=bld.data_of_fx, out_spec=out_spec, in_spec=in_spec,
        input_meta=[(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else None for x in flat_in],
        param_names=param_names, elem_fx=bld.elem_fx,
        input_consts={i: x for i, x in enumerate(flat_in) if not isinstance(x, torch.Tensor)},
        input_shared=shared_inputs(flat_in), output_views=views, specialised=specialised, drawn=drawn,
        host_random=host_random, torch_draws=torch_draws,
        kept_fx=kept, loss_probe=probe if tangents else None, kernels=family,
        call_args=gm.meta.get("memviz_call_args", {}), autocast=regions,
        autocast_cached=bool(regions) and torch.is_autocast_cache_enabled())

    def add_loss_nodes() -> None:
        # an output can be a view the graph only builds at its end: found through its storage.  The loss
        # reads every output, differentiated or not: the forward returns them all before it runs
        data_of_out = {k[1]: bld.data_of_fx.get(a.name, bld.data_of_storage.get(_storage_key(a.meta["val"])))
                       for a, k in zip(out_args, out_kinds, strict=False) if k and k[0] == "user"
                       and isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)}
        outs = sorted(set(data_of_out.values()))
        dl = bld.data("loss", lmem.loss, DataKind.OUTPUT, None, (), "float32")
        # what the loss's autograd graph keeps for its backward (measured, `loss_memory`): alive from the
        # loss to its backward, which releases it.  Always a node (0 bytes when nothing is saved): the
        # device's own measurement (`with_loss_memory`) may find what fake tensors do not
        saved = [bld.data("loss_saved", lmem.saved, DataKind.ACTIVATION, None, (), "float32")]
        captured.loss_compute = bld.b.compute("loss", outs, [dl, *saved], op="loss_fn", phase=Phase.FORWARD,
                                              source="loss_fn", temp_bytes=lmem.forward_temp)
        bld.compute_fx.append(None)
        # autograd hands the exported module every output gradient in one call and holds them all
        # until it returns: one data node for all of them, alive until the last one's last reader
        order = sorted(tangents)
        first = tangents[order[0]]
        v = first.meta["val"]
        name = f"grad_output{order[0]}" if len(order) == 1 else "grad_outputs"
        td = bld.data(name, sum(lmem.tangents.values()), DataKind.GRADIENT, first.name, tuple(v.shape),
                      _dtype_name(v))
        for idx in order:
            bld.data_of_fx[tangents[idx].name] = td
            bld.data_of_storage[_storage_key(tangents[idx].meta["val"])] = td
            captured.tangent_data[idx] = td
            captured.tangent_fx[idx] = tangents[idx].name
        captured.held_fx[td] = tuple(tangents[idx].name for idx in order[1:])
        tds = [td]
        if lmem.view_grads:
            # what the loss sends through views into parameters and inputs: autograd holds it until the
            # exported backward returns their gradients, then adds the two (`_loss_sizes`)
            tds.append(bld.data("output_view_grads", lmem.view_grads, DataKind.GRADIENT, None, (), "float32"))
            bld.b.outputs.append(tds[-1])
        # the loss's gradient, held by loss.backward() until the backward ends
        root = bld.data("loss_grad", lmem.loss_grad, DataKind.GRADIENT, None, (), "float32")
        # an output the loss's autograd graph saved stays alive until the loss's backward has run
        kept_idx = [views[i].base[1] if i in views else i for i in lmem.saved_outputs
                    if i not in views or views[i].base[0] == "output"]
        kept = sorted({data_of_out[j] for j in kept_idx if j in data_of_out})
        captured.output_data = data_of_out
        captured.loss_backward_compute = bld.b.compute("loss_backward", [dl, *saved, *kept], [*tds, root],
                                                       op="loss_fn.backward", phase=Phase.BACKWARD,
                                                       source="loss_fn", temp_bytes=lmem.backward_temp)
        bld.compute_fx.append(None)
        bld.b.outputs.extend([dl, root])

    pending_loss = bool(tangents)
    if pending_loss:
        bld.reads_instead = captured.reads_instead = written_back(gm, ph_kinds, out_args, out_kinds)
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            _constant_node(bld, gm, n)
            captured.constants[n.name] = str(n.target)
            continue
        if n.op != "call_function":
            continue
        phase = _phase_of(n)
        if phase is Phase.BACKWARD and pending_loss:
            add_loss_nodes()
            pending_loss = False
        bld.op_node(n, phase)
    if pending_loss:
        add_loss_nodes()
    captured.grad_data = {param_names.get(k[1], k[1]): bld.data_of_fx[a.name]
                          for a, k in zip(out_args, out_kinds, strict=True)
                          if k and k[0] == "grad" and a.name in bld.data_of_fx}
    captured.input_grad_data = {k[1]: bld.data_of_fx[a.name] for a, k in zip(out_args, out_kinds, strict=True)
                                if k and k[0] == "input_grad" and a.name in bld.data_of_fx}
    # the gradient is that FX value, which may be a view of its data node's storage (a layer-scale gamma's
    # [C] gradient viewed from a [1, C, 1, 1] reduction): runners hand back the view, not the storage
    captured.grad_fx = {(k[0], param_names.get(k[1], k[1]) if k[0] == "grad" else k[1]): a.name
                        for a, k in zip(out_args, out_kinds, strict=True)
                        if k and k[0] in ("grad", "input_grad") and a.name in bld.data_of_fx}
    graph = _finish(bld, out_args, out_kinds, type(model).__name__, mode, captured.loss_compute is not None,
                    module_classes(gm), regions)
    graph = accumulate_in_place(graph, captured)
    graph = with_loss_memory(graph, captured, lmem)  # the eager loss backward's workspace (graph known)
    return _in_random_order(graph, captured), captured


def accumulate_in_place(graph: Graph, cap: Captured) -> Graph:
    """`graph` with each parameter gradient that the joint graph sums out of place from two contributions
    (a weight used twice: tied embeddings) summed in place into the contribution produced first, as
    autograd's input buffer accumulates a gradient into the buffer that arrived first when nothing else
    holds it (``InputBuffer::accumulate``, ``can_accumulate_inplace``).

    The out-of-place ``add`` holds both contributions and the sum at once: on GPT2-large (257 MB each)
    it was the floor of every plan.  Eager ends no better (`summed_as_eager`); the exported module does.
    Rewritten: the first contribution's data node becomes the parameter gradient (kept to the end),
    the ``add`` writes it in place (`ComputeNode.mutates`, which `solvers.simulate` holds to running it
    once and never producing the written data again after it) and its own output, still the gradient's
    FX value, becomes a 0-byte token that orders the optimizer after the sum.  Every solver then plans
    the in-place sum with no solver knowing about it; the exported module runs ``add_``
    (`Captured.accumulates`).

    Only a sum whose first contribution nothing else reads, laid out as the sum (same shape, strides,
    dtype, storage of exactly its bytes: ``add_`` then returns the gradient the out-of-place ``add`` did)
    and added with ``alpha`` 1 (so the operands may swap) qualifies."""
    if cap.mode != "train":
        return graph
    nodes = cap.nodes
    datas, computes, outputs = list(graph.datas), list(graph.computes), list(graph.outputs)
    required = set(graph.outputs)
    for c in graph.computes:
        fx = cap.compute_fx[c.id] if c.id < len(cap.compute_fx) else None
        if fx is None or c.phase is not Phase.BACKWARD or len(c.outputs) != 1:
            continue
        node, out = nodes[fx], graph.datas[c.outputs[0]]
        if node.target is not torch.ops.aten.add.Tensor or node.kwargs.get("alpha", 1) != 1 \
                or out.kind is not DataKind.PARAMETER_GRADIENT or graph.consumers(out.id):
            continue
        slot = _accumulating_operand(graph, cap, node, c.id, out.id)
        if slot is None:
            continue
        first = cap.data_of_fx[node.args[slot].name]
        datas[first] = dataclasses.replace(datas[first], kind=DataKind.PARAMETER_GRADIENT)
        datas[out.id] = dataclasses.replace(out, bytes=0)
        computes[c.id] = dataclasses.replace(c, mutates=(first,))
        cap.accumulates[c.id] = slot
        if first not in required:
            outputs.append(first)
    if not cap.accumulates:
        return graph
    return Graph(tuple(computes), tuple(datas), tuple(outputs), name=graph.name, meta=dict(graph.meta))


def summed_as_eager(graph: Graph) -> Graph:
    """`graph` with each in-place gradient sum (`accumulate_in_place`) as eager PyTorch runs it: out of
    place, its result a third gradient-sized storage alive while the sum runs, beside both contributions.

    Eager autograd's input buffer sums in place only into a contribution nothing else holds that is not
    a view (``InputBuffer::accumulate``, ``can_accumulate_inplace``); a tied Linear's contribution is a
    transposed view, and on raw parameters the engine still holds the buffer: traced on CPU (torch 2.13)
    with a dispatch mode, both a tied GPT and `scale` of the zoo's raw-parameter model run
    ``aten.add.Tensor``, and ``AccumulateGrad`` then keeps that result as ``.grad`` (no copy), while both
    contributions are released.  So the sum's workspace is one more gradient and nothing else changes:
    after it one gradient is alive, as in `graph` (the written contribution standing for eager's result),
    and the same schedule is eager's on this graph and the exported module's on `graph`.  (Before: the
    first contribution was kept as an ordinary gradient beside an out-of-place sum to the end of the step,
    one gradient too many after the sum: +144 B on the raw-parameter model's AdamW step.)  The profile's
    baseline runs on it; plans run on `graph`, what the exported module measures; a plan for eager autograd
    (``sac``) runs on it too, and exported it runs the sum in place, within its model.

    Likewise the loss's backward gets eager's workspace (``eager_loss_backward_temp``, set by
    `with_loss_memory` where the loss saves an output that eager releases inside it).  `graph` itself
    when neither applies."""
    loss_temp = graph.meta.get("eager_loss_backward_temp")
    # (a sum into a gradient held from the step's start, `accumulated_into_grads`, is eager's own in-place
    # ``grad += new``: only a sum into a produced contribution runs out of place there)
    sums = [bool(c.mutates) and graph.datas[c.mutates[0]].producer is not None for c in graph.computes]
    if graph.meta.get("eager_sums") or (loss_temp is None and not any(sums)):
        return graph
    computes = [dataclasses.replace(c, temp_bytes=c.temp_bytes + graph.datas[c.mutates[0]].bytes)
                if summed else c for c, summed in zip(graph.computes, sums, strict=True)]
    if loss_temp is not None:  # the loss's backward releases an output it saved (`with_loss_memory`)
        computes = [dataclasses.replace(c, temp_bytes=int(loss_temp)) if c.op == "loss_fn.backward" else c
                    for c in computes]
    return Graph(tuple(computes), graph.datas, graph.outputs, name=graph.name,
                 meta={**graph.meta, "eager_sums": True})


#: `memviz.profile`'s ``grads``: what each parameter's ``.grad`` is when a step starts
GRADS = ("none", "accumulate")


def accumulated_into_grads(graph: Graph, cap: Captured) -> Graph:
    """`graph` for a step that starts with every parameter's ``.grad`` alive and adds into it (``grads=
    "accumulate"``): micro-batch gradient accumulation from the second micro-batch on (HF Trainer's
    ``gradient_accumulation_steps``, Lightning's ``accumulate_grad_batches``), or a loop that zeroes with
    ``zero_grad(set_to_none=False)``: both hold the gradients through the forward, and the memory is the same.

    Autograd's ``AccumulateGrad`` steals a fresh gradient as ``.grad`` when there is none (the default
    graph: the produced gradient is the parameter gradient, kept to the end); when there is one it adds
    the new gradient in place (``variable_grad += new_grad``: backward runs without grad mode) and the new
    one is released (torch/csrc/autograd/functions/accumulate_grad.h).  The engine runs it once the
    autograd node that produced the gradient has run all its backward ops (`_autograd_node_ends`: a
    Linear's weight gradient is alive while its bias gradient is summed).  Rewritten: each gradient gets
    a data node alive from the start (``<name>.grad``, the parameter's bytes, a required output), which the
    node's last backward op reads and writes in place (`ComputeNode.mutates`, which `solvers.simulate`
    holds to running once); the new gradient is alive until then (the producing op's workspace when it is
    that op, else a data node it reads) and its own data node becomes a 0-byte token the optimizer's update
    reads.  A tied weight's in-place sum (`accumulate_in_place`, the engine's own input buffer) is added
    on as it is made: its first contribution is then an ordinary gradient, released after it.
    `Graph.held_bytes` counts the gradients: no schedule can free them."""
    if cap.mode != "train" or not cap.grad_data:
        return graph
    datas, computes, outputs = list(graph.datas), list(graph.computes), list(graph.outputs)
    params = {d.name: d for d in graph.datas if d.kind is DataKind.PARAMETER and d.producer is None}
    ends, nodes = _autograd_node_ends(cap), cap.nodes  # (`nodes` is built per access)
    dropped: set[int] = set()
    for name, g in cap.grad_data.items():
        new, param = graph.datas[g], params.get(name)
        if new.producer is None or param is None or graph.consumers(g):
            raise CaptureError(f"parameter {name!r}: its gradient is not the output of one backward "
                               "operator that nothing else reads, so grads='accumulate' cannot model "
                               "adding it into .grad; profile with grads='none'")
        held = len(datas)
        datas.append(DataNode(id=held, name=f"{name}.grad", bytes=param.bytes,
                              kind=DataKind.PARAMETER_GRADIENT, shape=param.shape, dtype=param.dtype))
        outputs.append(held)
        x = new.producer
        tied = graph.computes[x].mutates
        fx = cap.compute_fx[x] if x < len(cap.compute_fx) else None
        last = x if tied or fx is None else max(x, ends.get(nodes[fx].meta.get("seq_nr"), x))
        reads: tuple[int, ...] = ()
        if tied:  # its contributions, summed in place into the first by the engine: that sum is added on
            dropped.update(tied)
            for first in tied:
                datas[first] = dataclasses.replace(datas[first], kind=DataKind.GRADIENT)
        elif last == x:  # the new gradient lives while its op runs, then goes into .grad
            computes[x] = dataclasses.replace(computes[x], temp_bytes=computes[x].temp_bytes + new.bytes)
            datas[g] = dataclasses.replace(new, bytes=0)
        else:  # alive until its autograd node's last op, which adds it into .grad
            fresh = len(datas)
            datas.append(DataNode(id=fresh, name=f"{new.name} (new gradient)", bytes=new.bytes,
                                  kind=DataKind.GRADIENT, producer=x, shape=new.shape, dtype=new.dtype))
            datas[g] = dataclasses.replace(new, bytes=0)
            computes[x] = dataclasses.replace(computes[x], outputs=(*computes[x].outputs, fresh))
            reads = (fresh,)
        c = computes[last]
        computes[last] = dataclasses.replace(c, inputs=(*c.inputs, *reads, held), mutates=(*c.mutates, held))
    cap.data_fx.extend([None] * (len(datas) - len(cap.data_fx)))  # .grad and new gradients: no FX value
    outputs = [d for d in outputs if d not in dropped]
    return Graph(tuple(computes), tuple(datas), tuple(outputs), name=graph.name,
                 meta={**graph.meta, "grads": "accumulate"})


def accumulated_grad_data(graph: Graph) -> dict[int, str]:
    """Data id -> parameter, for each gradient `graph` holds from the step's start (`accumulated_into_grads`
    names that data node ``<parameter>.grad``); empty for a step whose ``.grad`` starts None."""
    return {d.id: d.name.removesuffix(".grad") for d in graph.datas
            if d.producer is None and d.kind is DataKind.PARAMETER_GRADIENT}


def accumulated_grads(graph: Graph) -> frozenset[str]:
    """The parameters whose gradient `graph` holds from the step's start (`accumulated_grad_data`)."""
    return frozenset(accumulated_grad_data(graph).values())


def _autograd_node_ends(cap: Captured) -> dict[int, int]:
    """``seq_nr`` of each eager autograd node -> its last backward compute: AOTAutograd copies the node's
    sequence number onto the backward ops it traced for it (as `memviz.profiling.saved` reads them);
    the engine's own gradient sums (``is_gradient_acc``) belong to no node."""
    nodes, ends = cap.nodes, {}
    for c, name in enumerate(cap.compute_fx):
        n = nodes[name] if name is not None else None
        if n is not None and is_backward(n) and not n.meta.get("is_gradient_acc") \
                and n.meta.get("seq_nr") is not None:
            ends[n.meta["seq_nr"]] = c
    return ends


def _accumulating_operand(graph: Graph, cap: Captured, node: torch.fx.Node, cid: int, out: int) -> int | None:
    """Which argument of the gradient sum `node` (0 or 1) the sum can be written into, or None: the
    contribution produced first among those only this sum reads, whose FX value is laid out exactly
    as the sum and spans its whole storage."""
    args = node.args
    if len(args) != 2 or not all(isinstance(a, torch.fx.Node) and a.name in cap.data_of_fx for a in args):
        return None
    ids = [cap.data_of_fx[a.name] for a in args]
    if ids[0] == ids[1]:
        return None
    res = node.meta.get("val")
    found = []
    for slot, (a, d) in enumerate(zip(args, ids, strict=True)):
        v, data = a.meta.get("val"), graph.datas[d]
        if data.producer is None or graph.consumers(d) != (cid,) or d in graph.outputs or not (
                isinstance(v, torch.Tensor) and isinstance(res, torch.Tensor) and v.shape == res.shape
                and v.stride() == res.stride() and v.dtype == res.dtype and v.storage_offset() == 0
                and data.bytes == graph.datas[out].bytes == storage_nbytes(v)):
            continue
        found.append((data.producer, slot))
    return min(found)[1] if found else None


def written_back(gm: torch.fx.GraphModule, ph_kinds: list[tuple[str, Any]], out_args: list[Any],
                 out_kinds: list[tuple[str, Any] | None]) -> dict[str, str]:
    """FX value of a mutated buffer's new value -> the buffer's FX placeholder (`Captured.reads_instead`).

    The functional graph hands BatchNorm's backward the new running statistics, which would keep them
    alive through the forward; eager updates the buffers in place and hands it those.  The exported
    module writes the new values back where they are computed, so the buffer holds the same values
    for every later reader."""
    buffers = {key: n.name for n, (kind, key) in zip(gm.graph.find_nodes(op="placeholder"), ph_kinds,
                                                      strict=False) if kind == "buffer"}
    return {a.name: buffers[k[1]] for a, k in zip(out_args, out_kinds, strict=True)
            if k is not None and k[0] == "buffer" and isinstance(a, torch.fx.Node)
            and a.op == "call_function" and k[1] in buffers}


def is_random(node: torch.fx.Node) -> bool:
    """Whether the FX node draws from the RNG (`draws_random`)."""
    return draws_random(node.target)


def draws_random(target: Any) -> bool:
    """Whether the operator draws from the RNG (dropout, bernoulli, rand...): ATen tags every seeded
    nondeterministic operator; memviz's own CPU dropout kernel is one too."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return torch.Tag.nondeterministic_seeded in target.tags or target._schema.name == "memviz::cpu_dropout"


def _in_random_order(graph: Graph, cap: Captured) -> Graph:
    """`graph` with its random operators' first executions chained in capture (eager) order.

    The generator is one stream: the order in which operators first draw from it decides every mask.
    The exported module saves each random operator's RNG state at its first execution (and replays it
    when recomputing), so a schedule that ran the decoder's embedding dropout before the encoder's
    dropouts (rotor, rockmate and sqrt did on BART) drew other masks than eager mode and silently
    trained on other gradients.  The 0-byte order tokens (`solvers.with_order_chain`) make the order a
    data dependency that every solver and `simulate` already enforce."""
    nodes = cap.nodes
    random = [c for c, fx in enumerate(cap.compute_fx) if fx is not None and is_random(nodes[fx])]
    chained = with_order_chain(graph, random)
    cap.data_fx.extend([None] * (len(chained.datas) - len(cap.data_fx)))  # tokens hold no tensor
    return chained


def _constant_node(bld: _Builder, gm: torch.fx.GraphModule, n: torch.fx.Node) -> None:
    """A tensor constant of the graph (``torch.tensor([...])`` in the model's code: HF's mask helpers,
    torchvision's shifted-window mask) as a data node of kind BUFFER: like a non-persistent buffer the
    graph module holds it as an attribute, no op produces it, it gets no gradient and is alive for
    the whole step, with its exact bytes.  Ops read it (``lift_fresh_copy`` copies it into the fresh
    tensor eager mode creates) where it sits in the graph."""
    val = _attr(gm, str(n.target))
    if not isinstance(val, torch.Tensor):
        raise CaptureError(f"unsupported graph attribute {n.target!r} of type {type(val).__name__} in the "
                           "captured graph", _module_of(n), source_of(n))
    fake = n.meta.get("val")
    t = fake if isinstance(fake, torch.Tensor) else val  # views of it share the fake storage
    if _storage_key(t) in bld.data_of_storage:  # another name for a constant already there
        d = bld.data_of_storage[_storage_key(t)]
        bld.aliases[d].append(n.name)
    else:
        d = bld.tensor_data(f"constant {n.target}", t, DataKind.BUFFER, n.name)
    bld.data_of_fx[n.name] = d


def _finish(bld: _Builder, out_args: list[Any], out_kinds: list[tuple[str, Any] | None], name: str,
            mode: str, handed_to_loss: bool = False, classes: dict[str, str] | None = None,
            autocast: tuple[tuple[str, torch.dtype], ...] = ()) -> Graph:
    """Set the kinds that depend on consumers and graph outputs; list the required outputs.

    `handed_to_loss` (a training graph with its loss nodes): the model's outputs are not required to the
    end of the step.  Eager frees them once the loss has read them (``loss_fn(model(x)).backward()``;
    backward reads only what autograd saved, and the loss node holds what the user's loss saves), and the
    new values of mutated buffers once they are written back (eager updates BatchNorm's statistics in
    place).  Inference hands its outputs to the caller: they stay.  `classes` (`module_classes`) goes
    into the graph's meta as ``module_classes``, the `autocast` regions of the capture as ``autocast``
    (`accelerator.autocast_json`: a plan file keeps them, and its verifying step enters them)."""
    graph = bld.b.build()
    kinds: dict[int, DataKind] = {}
    for d in graph.datas:
        if d.kind is DataKind.ACTIVATION and any(
                graph.computes[c].phase is Phase.BACKWARD for c in graph.consumers(d.id)):
            kinds[d.id] = DataKind.SAVED
    required = list(bld.b.outputs)
    for a, k in zip(out_args, out_kinds, strict=False):
        if k is None or not isinstance(a, torch.fx.Node) or a.name not in bld.data_of_fx:
            continue
        d = bld.data_of_fx[a.name]
        produced = graph.datas[d].producer is not None
        if k[0] == "user" and produced:
            kinds[d] = DataKind.OUTPUT
        elif k[0] == "grad":
            kinds[d] = DataKind.PARAMETER_GRADIENT
        elif k[0] == "buffer" and produced:
            kinds[d] = DataKind.BUFFER
        if not (handed_to_loss and produced and k[0] in ("user", "buffer")):
            required.append(d)
    datas = tuple(
        type(d)(id=d.id, name=d.name, bytes=d.bytes, kind=kinds.get(d.id, d.kind), producer=d.producer,
                shape=d.shape, dtype=d.dtype, aliases=tuple(bld.aliases[d.id]))
        for d in graph.datas
    )
    return Graph(graph.computes, datas, tuple(dict.fromkeys(required)), name=name,
                 meta={"mode": mode, "module_classes": dict(classes or {}),
                       "autocast": accelerator.autocast_json(autocast)})


# --- replaying the graph ------------------------------------------------------------------------------
class NotAlive(RuntimeError):
    """A compute step read a tensor the schedule had freed (or never computed)."""


class Runner:
    """Executes compute/free steps of a CD-graph over the captured FX graph, one FX node per compute.

    ``env`` holds one tensor per live storage (per data node); views and shape queries are replayed on
    demand from it, so they cost no memory, and ``free(d)`` drops the only reference memviz holds.
    Used by the profiler (timing each op) and by the exported module (executing a plan).
    """

    def __init__(self, captured: Captured, placeholders: dict[str, torch.Tensor]) -> None:
        self.cap = captured
        self.nodes = captured.nodes
        self.owners = captured.compute_fx_set
        self.env: dict[str, Any] = dict(placeholders)

    def value(self, node: Any) -> Any:
        if not isinstance(node, torch.fx.Node):
            return node  # a constant the graph returns (an int output): its own value
        if node.name in self.env:
            return self.env[node.name]
        if node.op != "call_function" or node.name in self.owners:
            raise NotAlive(f"{node.name} is not alive: the schedule freed it or never computed it")
        args, kwargs = self.resolve(node)
        return node.target(*args, **kwargs)

    def resolve(self, node: torch.fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args = torch.fx.node.map_arg(node.args, self.argument)
        kwargs = torch.fx.node.map_arg(node.kwargs, self.argument)
        return args, kwargs

    def argument(self, node: Any) -> Any:
        """An operator's argument: a mutated buffer's new value is read from the buffer (`reads_instead`)."""
        if isinstance(node, torch.fx.Node) and node.name in self.cap.reads_instead:
            node = self.nodes[self.cap.reads_instead[node.name]]
        return self.value(node)

    def call(self, cid: int) -> Callable[[], Any]:
        """A closure running compute node `cid`'s operator on its (already resolved) inputs."""
        node = self.nodes[self.cap.compute_fx[cid]]
        args, kwargs = self.resolve(node)
        return lambda: node.target(*args, **kwargs)

    def store(self, cid: int, out: Any) -> None:
        name = self.cap.compute_fx[cid]
        elems = self.cap.elem_fx.get(name)
        if elems is None:
            self.env[name] = out
        else:
            for i, getitem in elems:
                self.env[getitem] = out[i]

    def compute(self, cid: int) -> None:
        self.store(cid, self.call(cid)())

    def free(self, d: int) -> None:
        name = self.cap.data_fx[d]
        if name is not None:
            self.env.pop(name, None)
        for other in self.cap.held_fx.get(d, ()):
            self.env.pop(other, None)

    def data_value(self, d: int) -> Any:
        name = self.cap.data_fx[d]
        return None if name is None else self.env.get(name)
