"""One rank of an FSDP2 / tensor-parallel training step as a CD-graph (`memviz.profile(..., parallel=)`).

memviz's capture (torch.export + the AOT joint graph) does not trace FSDP2: its parameter all-gathers
and gradient reduce-scatters run in module hooks on process-group work objects, and its unsharded
parameters are storages it resizes by hand (``UntypedStorage.resize_``), which no tracer sees.  So a
parallel profile is *recorded*, not traced: memviz shards a copy of the model (``fully_shard`` per
block, then the root; ``parallelize_module`` for tensor parallelism) on a DeviceMesh over PyTorch's
fake process group (`torch.testing._internal.distributed.fake_pg`: collectives allocate their buffers
but move no data) as rank `Parallel.rank` of `Parallel.world_size`, runs one real step in this process,
and `_Recorder` (a TorchDispatchMode) writes down every operator with the storages it reads and
creates, when each storage is released (weak references on storages, and the storage resizes FSDP2
makes), and the time each operator took.  Memory is exact for the local shapes; values are not (the
fake collectives leave garbage in their outputs), which only matters to data-dependent control flow.

The graph holds what one rank holds: parameter shards (FSDP2's padded local shards), their gradient
shards and optimizer state, the all-gather / reduce-scatter buffers and the unsharded parameters
(kind ``communication``), activations with local (tensor-parallel) shapes, and every collective as a
compute node (``c10d.*`` for FSDP2, ``_c10d_functional.*`` for DTensor redistributions).  The baseline
schedule is the recorded order with every free where the step released it, so its simulated peak is
the recorded rank's live-storage peak.

Collective buffers as the rank's backend holds them: a rank recorded on CPU is a CPU rank, whose backend
is gloo, and gloo reduce-scatters a copy of its input (`gloo_input_copy`), which the fake group does not
make; the recording adds that copy where gloo holds it.  An estimated rank of a GPU target runs NCCL, which
reduce-scatters from the input itself: no copy.

Collective times: estimated (``device="fake:<target>"``), each collective takes the alpha-beta time of
`memviz.hardware.collectives` over the target's interconnect and the ranks of its group; recorded on a real
gloo / NCCL group, the time the operator took, as for every operator (an asynchronous collective's
launch: the wait is no operator); recorded on CPU over the fake group, the fake's (next to none).

What is absent: export (a recorded graph is no FX program: `memviz.export` refuses),
other ranks' asymmetries beyond the local shard sizes (pass ``rank=``).  Pipeline stages
(``Parallel(pp=)``, with FSDP2 or tensor parallelism) are recorded by `memviz.parallel.pipeline`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import inspect
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.module_tracker import ModuleTracker

from memviz.hardware.collectives import INTERCONNECTS, collective_kind, collective_seconds, link_of
from memviz.profiling.profile import Profile, _check_measured
from memviz.profiling.tracker import StorageTracker, tensors_of
from solvers import DataKind, Graph, GraphBuilder, Phase, simulate
from solvers.schedule import Schedule, Step

__all__ = ["Parallel", "ParallelError", "ShardedStorageTracker", "is_parallel_model", "profile_parallel"]


class ParallelError(ValueError):
    """The model or the requested parallelism cannot be profiled as asked (the message says why)."""


@dataclass(frozen=True)
class Parallel:
    """How one rank runs: `world_size` ranks in all; FSDP2 over ``world_size // tp`` of them when
    `fsdp`; tensor parallelism of degree `tp` (``tp * pp == world_size`` without FSDP); `sp`: sequence
    parallelism inside the tensor-parallel blocks (norms and dropout on ``seq / tp`` tokens).  `rank`
    is the rank profiled (shard sizes can differ on the last rank when a dimension does not divide).
    `reshard_after_forward`: ``fully_shard``'s, for every block: False keeps each block's gathered
    parameters from its forward to its backward (no second all-gather, more memory: ZeRO-2).
    `pp`: pipeline stages (`memviz.parallel.pipeline`), `microbatches` per step (default `pp`), `schedule`
    "1f1b" or "gpipe"; with ``fsdp=False`` rank i runs stage i (``world_size == pp``); with `fsdp` the ranks
    form a (pp, dp) mesh, rank r runs stage ``r // dp`` fully_shard-ed over its ``dp = world_size / pp``
    ranks (torchtitan's PP x FSDP2); with ``tp > 1`` and ``fsdp=False`` they form a (pp, tp) mesh, rank r runs
    stage ``r // tp`` with tensor parallelism over its ``tp`` ranks (PP x TP; not with `fsdp` as well)."""

    world_size: int
    fsdp: bool = True
    tp: int = 1
    sp: bool = False
    rank: int = 0
    reshard_after_forward: bool = True
    pp: int = 1
    microbatches: int | None = None
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.tp < 1 or self.pp < 1:
            raise ParallelError(f"world_size, tp and pp must be positive, not {self.world_size}, {self.tp} "
                                f"and {self.pp}")
        if self.world_size % self.tp:
            raise ParallelError(f"tp={self.tp} does not divide world_size={self.world_size}")
        self._check_pipeline()
        if not self.fsdp and self.world_size != self.tp * self.pp:
            raise ParallelError(
                f"world_size={self.world_size} with tp={self.tp} and fsdp=False means data-parallel replicas "
                "(DDP), which memviz does not model: use fsdp=True or world_size == tp")
        if self.sp and self.tp == 1:
            raise ParallelError("sp=True (sequence parallelism) needs tp > 1")
        if not 0 <= self.rank < self.world_size:
            raise ParallelError(f"rank {self.rank} is not in range(world_size={self.world_size})")
        if not self.reshard_after_forward and not self.fsdp:
            raise ParallelError("reshard_after_forward=False is fully_shard's: it needs fsdp=True")

    def _check_pipeline(self) -> None:
        from memviz.parallel.pipeline import SCHEDULES

        if self.microbatches is None:
            object.__setattr__(self, "microbatches", self.pp)  # frozen: the default is pp micro-batches
        if self.microbatches < 1:
            raise ParallelError(f"microbatches must be positive, not {self.microbatches}")
        if self.schedule not in SCHEDULES:
            raise ParallelError(f"schedule {self.schedule!r}: one of {sorted(SCHEDULES)}")
        if self.pp > 1 and self.tp > 1 and self.fsdp:
            raise ParallelError(
                f"pp={self.pp} x tp={self.tp} with FSDP2 (3-D parallelism) is not modelled: pipeline x "
                "tensor parallelism (fsdp=False, world_size = pp x tp) and pipeline x FSDP2 (tp=1) are")
        if self.pp > 1 and self.world_size % self.pp:
            raise ParallelError(f"pp={self.pp} does not divide world_size={self.world_size}")
        if self.pp > 1 and self.fsdp and self.world_size == self.pp:
            # fully_shard over one rank keeps a second, unsharded copy of every parameter: not what a
            # pipeline-only user asks for by leaving fsdp at its default
            raise ParallelError(f"pp={self.pp} on world_size={self.world_size} leaves one rank per stage: "
                                "pass fsdp=False for pipeline alone, or world_size = pp x dp for PP x FSDP2")

    @property
    def dp(self) -> int:
        """Ranks one parameter is sharded over by FSDP2 (1 without FSDP)."""
        return self.world_size // (self.tp * self.pp) if self.fsdp else 1

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "fsdp": self.fsdp, "tp": self.tp, "sp": self.sp,
                "rank": self.rank, "reshard_after_forward": self.reshard_after_forward, "pp": self.pp,
                "microbatches": self.microbatches, "schedule": self.schedule}


# --- is the model already parallel? -----------------------------------------------------------------------
def _dtensor_type() -> type | None:
    """DTensor when torch.distributed.tensor is loaded, else None: no DTensor can exist before that import,
    and importing it costs seconds that a plain `memviz.profile` must not pay."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def is_parallel_model(model: nn.Module) -> bool:
    """True when `model` was wrapped with ``fully_shard`` or ``parallelize_module`` (DTensor parameters)."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return False
    fsdp = sys.modules.get("torch.distributed.fsdp")
    fsdp_module = getattr(fsdp, "FSDPModule", ())
    return isinstance(model, fsdp_module) or any(isinstance(p, dtensor) for p in model.parameters())


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding this rank's storage (a DTensor's local shard; a plain tensor itself)."""
    dtensor = _dtensor_type()
    return t._local_tensor if dtensor is not None and isinstance(t, dtensor) else t


def local_tensors(*objs: Any) -> list[torch.Tensor]:
    """`memviz.profiling.tracker.tensors_of` with DTensors replaced by their local shards."""
    return [local(t) for t in tensors_of(*objs)]


# --- storage resizes (FSDP2's unsharded parameters) --------------------------------------------------------
@contextlib.contextmanager
def _resize_hook(on_resize: Callable[[torch.UntypedStorage, int, int], None]) -> Iterator[None]:
    """Call ``on_resize(storage, old_nbytes, new_nbytes)`` after every ``UntypedStorage.resize_``.

    FSDP2 frees and re-allocates unsharded parameters with ``storage.resize_`` (``free_storage`` /
    ``alloc_storage`` in ``torch.distributed.fsdp._fully_shard._fsdp_param``), a storage method no
    dispatch mode sees; torch's own ``FSDPMemTracker`` wraps the method the same way."""
    original = torch.UntypedStorage.resize_

    def resize_(storage: torch.UntypedStorage, size: int) -> Any:
        old = int(storage.nbytes())
        out = original(storage, size)
        on_resize(storage, old, int(storage.nbytes()))
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _unrecorded_sharding_propagation(rec: _Recorder) -> Iterator[None]:
    """Tell `rec` when DTensor's sharding propagation runs an operator only to learn its output's shape
    (``ShardingPropagator._propagate_tensor_meta_non_cached``: "not part of the real (local)
    computation"), so it records none of it.  On fake tensors that run uses the step's own FakeTensorMode
    (``detect_fake_mode``), so its tensors look like the step's: an estimated tensor-parallel step, whose
    propagation cache is cold (no warm-up step), recorded TinyGPT's first such profile in a process with
    79 extra operators and a 10% higher peak than the next one.  No-op where torch has no such method."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = getattr(ShardingPropagator, "_propagate_tensor_meta_non_cached", None)
    if original is None:
        yield
        return

    def propagate(self: Any, op_schema: Any) -> Any:
        rec.propagating += 1
        try:
            return original(self, op_schema)
        finally:
            rec.propagating -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]


def _is_dtensor_call(types: Iterable[type]) -> bool:
    dtensor = _dtensor_type()
    return dtensor is not None and any(issubclass(t, dtensor) for t in types)


def _not_memory(t: torch.Tensor, fake_mode: Any = None) -> bool:
    """Meta and fake tensors (DTensor propagates shardings on them) hold no memory of this rank, except
    the fake tensors of `fake_mode`, the mode an estimated step runs in (they stand for real ones)."""
    if t.device.type == "meta":
        return True
    return isinstance(t, torch._subclasses.FakeTensor) and (fake_mode is None or t.fake_mode is not fake_mode)


class ShardedStorageTracker(StorageTracker):
    """`memviz.profiling.tracker.StorageTracker` for parallel models: DTensor operators are let through to run
    as their local operators (which the mode then sees), and storage resizes count as allocations and
    frees.  Pass ``local_tensors(model, optimizer, inputs)`` as `preexisting`."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _is_dtensor_call(types):
            return NotImplemented
        out = super().__torch_dispatch__(func, types, args, kwargs)
        copied = gloo_input_copy(func, args, kwargs or {})
        if copied is not None:  # held with everything alive now, dropped when the collective returns
            self.peak_bytes = max(self.peak_bytes, self.live_bytes + copied.untyped_storage().nbytes())
        return out

    def _resized(self, storage: torch.UntypedStorage, old: int, new: int) -> None:
        key = storage._cdata
        if key in self._alive:
            self.live_bytes += new - self._alive[key]
            self._alive[key] = new
            if new == 0:
                self._alive.pop(key)
        elif new:
            self._alive[key] = new
            self.live_bytes += new
            weakref.finalize(storage, self._release, key)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def __enter__(self) -> ShardedStorageTracker:
        self._resize_ctx = _resize_hook(self._resized)
        self._resize_ctx.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._resize_ctx.__exit__(*exc)


# --- recording one step -------------------------------------------------------------------------------------
#: Operators that only record profiler ranges or read metadata (``prim::device``, which fake tensors
#: dispatch): no storage, no work worth a node.
_SKIP_NAMESPACES = frozenset({"profiler", "prim"})
#: Collectives run on process-group work objects (FSDP2) and FSDP2's own copy-in/out kernels: their
#: buffers are communication buffers.  DTensor's functional collectives (_c10d_functional) produce
#: activations and gradients and keep the kind their phase gives.
_COMM_NAMESPACES = frozenset({"c10d", "fsdp"})
#: c10d's in-place collectives do not mark their written arguments in the schema: these are the buffers.
_COMM_OUTPUTS = frozenset({"output_tensor", "output_tensors", "all_gather_output", "output"})
#: the suffix of the compute nodes a checkpointed region's recomputation ran (a per-rank plan's graph)
RECOMPUTED = "(recomputed)"


@dataclass
class _Data:
    name: str
    nbytes: int
    kind: DataKind | None  # None: decided after the step (`_classify`)
    producer: int | None = None
    shape: tuple[int, ...] = ()
    dtype: str = ""
    phase: Phase | None = None
    comm: bool = False
    read_in: set[Phase] = field(default_factory=set)


@dataclass
class _Compute:
    name: str
    op: str
    phase: Phase
    inputs: list[int]
    outputs: list[int]
    time: float
    module: str


class _ForwardOnlyInRecomputation(ModuleTracker):
    """torch's ModuleTracker, registering no backward hooks on the tensors of a checkpointed region's
    recomputation (`memviz.runtime.apply.recomputing`): the tracker holds its hooks to its exit, and theirs
    keep the recomputed autograd graph and its saved tensors (the re-gathered inputs under sequence
    parallelism) alive for the rest of the step, where the user's run, without the tracker, frees them after
    their backward (Llama's last layer checkpointed: 1,082,236 B recorded against 972,412 B measured).  The
    recomputation runs inside the backward of its region, whose module names the tracker already holds."""

    def _fw_pre_hook(self, mod: nn.Module, input: Any) -> None:
        from memviz.runtime.apply import recomputing

        if not recomputing():
            super()._fw_pre_hook(mod, input)

    def _fw_post_hook(self, mod: nn.Module, input: Any, output: Any) -> None:
        from memviz.runtime.apply import recomputing

        if not recomputing():
            super()._fw_post_hook(mod, input, output)


class _Recorder(TorchDispatchMode):
    """Every operator of a step with the storages it reads and creates, and every storage's release,
    in order (`steps`: ("compute", i) and ("free", data) events)."""

    def __init__(self, sources: dict[str, list[tuple[str, torch.Tensor]]], fake_mode: Any = None,
                 target: Any = None) -> None:
        from memviz.runtime.apply import recomputing

        super().__init__()
        self.recomputing = recomputing  # a checkpointed region (memviz.apply) re-running its forward
        self.fake_mode = fake_mode  # an estimated step: its fake tensors are memory, its times estimated
        self.target = target  # memviz.hardware.devices.Target giving each operator's roofline time
        # the rank's backend is gloo (a CPU rank: recorded on CPU, or estimated for the CPU target), whose
        # reduce-scatter copies its input (`gloo_input_copy`); a GPU target's NCCL copies nothing
        self.gloo = target is None or target.name == "cpu"
        self.datas: list[_Data] = []
        self.computes: list[_Compute] = []
        self.steps: list[tuple[str, int]] = []
        self.alive: dict[int, int] = {}  # storage key -> data id
        self.phase = Phase.FORWARD
        self.modules = _ForwardOnlyInRecomputation()
        self.keep: list[Any] = []  # finalizer handles
        self.tokens: dict[int, int] = {}  # data id -> token of its last in-place write
        self.token_ids: list[int] = []
        self.propagating = 0  # inside DTensor's shape-only sharding propagation (not the step's work)
        for kind, tensors in sources.items():
            for name, t in tensors:
                self._source(name, t, DataKind(kind))

    # storages ------------------------------------------------------------------------------------
    def _source(self, name: str, t: torch.Tensor, kind: DataKind) -> int | None:
        storage = t.untyped_storage()
        if storage._cdata in self.alive or storage.nbytes() == 0:
            return self.alive.get(storage._cdata)
        return self._new(storage, _Data(name, int(storage.nbytes()), kind, shape=tuple(t.shape),
                                        dtype=str(t.dtype).replace("torch.", "")))

    def _new(self, storage: torch.UntypedStorage, data: _Data) -> int:
        d = len(self.datas)
        self.datas.append(data)
        key = storage._cdata
        self.alive[key] = d
        self.keep.append(weakref.finalize(storage, self._released, key, d))
        return d

    def _released(self, key: int, d: int) -> None:
        if self.alive.get(key) == d:
            del self.alive[key]
            self.steps.append(("free", d))

    def _resized(self, storage: torch.UntypedStorage, old: int, new: int) -> None:
        key = storage._cdata
        if key in self.alive:  # a resize of a live storage: freed here, re-allocated below if new > 0
            self._released(key, self.alive[key])
        if new:
            d = self._new(storage, _Data(f"unsharded{len(self.datas)}", new, DataKind.COMMUNICATION,
                                         phase=self.phase, comm=True))
            self._add_compute("fsdp.alloc_storage", "fsdp.alloc_storage", [], [d], 0.0)

    # operators -----------------------------------------------------------------------------------
    def _add_compute(self, name: str, op: str, inputs: list[int], outputs: list[int], seconds: float) -> None:
        c = len(self.computes)
        for d in outputs:
            self.datas[d].producer = c
        for d in inputs:
            self.datas[d].read_in.add(self.phase)
        parents = [p for p in self.modules.parents if p != "Global"]
        if self.recomputing():
            name = f"{name} {RECOMPUTED}"
        self.computes.append(_Compute(name, op, self.phase, inputs, outputs, seconds,
                                      max(parents, key=len) if parents else ""))
        self.steps.append(("compute", c))

    def _waited(self, t: torch.Tensor, seconds: float) -> None:
        """A functional collective's wait: its time is the collective's (the launch returned at once), so it
        goes to the node that made the waited tensor; the wait itself is no node (it returns its argument)."""
        d = self.alive.get(t.untyped_storage()._cdata)
        producer = None if d is None else self.datas[d].producer
        if producer is not None:
            self.computes[producer].time += seconds

    def _written(self, func: Any, args: Any, kwargs: dict[str, Any], comm: bool) -> list[int]:
        """Data nodes an operator writes into in place: its mutable arguments and, for a collective or
        FSDP2 copy (`comm`), its ``out=`` / ``output_tensor`` buffers (allocated by FSDP2 with
        ``torch.empty``); the gradients it only reads keep their kind."""
        found = []
        for i, name in _written_arguments(func, comm):
            value = args[i] if i < len(args) else kwargs.get(name)
            for t in pytree.tree_leaves(value):
                if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata in self.alive:
                    found.append(self.alive[t.untyped_storage()._cdata])
        return found

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _is_dtensor_call(types):
            return NotImplemented  # DTensor runs as local operators, which come back through this mode
        kwargs = kwargs or {}
        if self.propagating:
            return func(*args, **kwargs)
        ins = [leaf for leaf in pytree.tree_leaves((args, kwargs))
               if isinstance(leaf, torch.Tensor) and not _not_memory(leaf, self.fake_mode)]
        before = {t.untyped_storage()._cdata for t in ins}
        t0 = time.perf_counter()
        if func is torch.ops._c10d_functional.wait_tensor.default and self.fake_mode is not None:
            # eager's wait returns its argument; the fake kernel makes a new tensor (as FSDPMemTracker notes)
            out = args[0]
        else:
            out = func(*args, **kwargs)
            if func.namespace == "c10d" and self.fake_mode is None:
                _wait(out)
        seconds = time.perf_counter() - t0
        namespace = func.namespace
        if namespace in _SKIP_NAMESPACES:
            return out
        if func is torch.ops._c10d_functional.wait_tensor.default:
            if self.target is None:
                self._waited(args[0], seconds)
            return out
        if self.target is not None:
            seconds = _estimated_seconds(self.target, func, args, kwargs, out, ins)
        inputs = [self.alive[k] for k in dict.fromkeys(before) if k in self.alive]
        outputs: list[int] = []
        comm = namespace in _COMM_NAMESPACES
        for leaf in pytree.tree_leaves(out):
            if not isinstance(leaf, torch.Tensor) or _not_memory(leaf, self.fake_mode):
                continue
            storage = leaf.untyped_storage()
            if storage._cdata in self.alive or storage.nbytes() == 0:
                continue
            outputs.append(self._new(storage, _Data(
                f"{func.__name__}.{len(self.datas)}", int(storage.nbytes()), None, shape=tuple(leaf.shape),
                dtype=str(leaf.dtype).replace("torch.", ""), phase=self.phase, comm=comm)))
        copied = gloo_input_copy(func, args, kwargs) if self.gloo else None
        if copied is not None:
            gloo_copy = self._gloo_copy(copied)
            outputs.append(gloo_copy)
        written = self._written(func, args, kwargs, comm)
        if comm:
            for d in written:
                if self.datas[d].kind is None:
                    self.datas[d].comm = True
        if not outputs and not inputs:
            return out  # DTensor's sharding propagation on fake tensors: no memory of this rank
        if not outputs and not written:
            return out  # a view (``_unsafe_view`` too) or a read of metadata: consumers read the base's node
        # a reader of data written in place depends on the write (its token); the write on earlier readers'
        # data is ordered by their own tokens
        inputs += [t for t in dict.fromkeys(self.tokens[d] for d in inputs if d in self.tokens)
                   if t not in inputs]
        if written and self.phase is not Phase.OPTIMIZER:
            # an in-place write (FSDP2's copy-out into the unsharded parameters, an all-reduce) creates no
            # storage: a 0-byte token, a required output, carries the dependency to later readers, so the
            # writer is an ancestor of what reads its result (the optimizer's updates stay output-less,
            # required computes)
            token = len(self.datas)
            self.datas.append(_Data(f"written by {func.__name__}", 0, DataKind.ACTIVATION, phase=self.phase))
            self.token_ids.append(token)
            outputs.append(token)
            for d in written:
                self.tokens[d] = token
        self._add_compute(str(func.overloadpacket.__name__) if namespace == "aten" else f"{namespace}."
                          f"{func.overloadpacket.__name__}", str(func), inputs, outputs, seconds)
        if copied is not None:  # gloo's Work drops its copy when the (synchronous) collective returns
            self.steps.append(("free", gloo_copy))
        return out

    def _gloo_copy(self, t: torch.Tensor) -> int:
        """A data node for gloo's copy of the collective input `t` (no storage of this process: the fake
        group made none); the collective creates it and frees it right after."""
        d = len(self.datas)
        self.datas.append(_Data(f"gloo copy of the input {d}", int(t.untyped_storage().nbytes()),
                                DataKind.COMMUNICATION, shape=tuple(t.shape),
                                dtype=str(t.dtype).replace("torch.", ""), phase=self.phase, comm=True))
        return d


@functools.cache
def _written_arguments(func: Any, comm: bool) -> tuple[tuple[int, str], ...]:
    """(position, name) of the arguments `func` writes in place (`_Recorder._written`): a schema's, cached
    per operator (the walk over the schema's arguments for every operator was 3% of an 8B rank's profile)."""
    return tuple((i, arg.name) for i, arg in enumerate(func._schema.arguments)
                 if (arg.alias_info is not None and arg.alias_info.is_write)
                 or (comm and arg.name in _COMM_OUTPUTS))


def _wait(out: Any) -> None:
    """Wait for the work objects a c10d collective returned, so that its measured time is the collective's,
    not its launch's: the caller (FSDP2, ``dist.all_gather_into_tensor``) waits for them only after the
    operator has returned, outside any dispatch mode.  Memory is unchanged (the buffers exist already); an
    asynchronous collective loses its overlap with the next operators in the recorded step only."""
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.ScriptObject) and leaf._type().qualified_name().endswith("Work"):
            dist.distributed_c10d.Work.unbox(leaf).wait()


def _estimated_seconds(target: Any, func: Any, args: Any, kwargs: dict[str, Any], out: Any,
                       ins: list[torch.Tensor]) -> float:
    """Time of one operator on `target`: a collective's from `memviz.hardware.collectives`' alpha-beta model
    over its process group (the fake group moves no data); any other operator's roofline, with FLOPs from
    torch's flop formulas (0 where it has none: elementwise work is bandwidth-bound) and bytes moved =
    inputs read + outputs written."""
    from torch.utils.flop_counter import flop_registry

    kind = collective_kind(str(func))
    if kind is not None:
        return _collective_seconds(target, kind, func, args, kwargs, out)

    formula = flop_registry.get(func.overloadpacket)
    flops = float(formula(*args, **kwargs, out_val=out)) if formula is not None else 0.0
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    moved = sum(t.numel() * t.element_size() for t in (*ins, *outs))
    dtype = next((t.dtype for t in (*ins, *outs) if t.is_floating_point()), torch.float32)
    return target.op_time(flops, moved, dtype)


def _process_group(func: Any, args: Any, kwargs: dict[str, Any]) -> dist.ProcessGroup | None:
    """The process group a collective runs on (None: it names none): c10d's ops take the group object,
    DTensor's functional collectives its registered name."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    for i, arg in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        if isinstance(value, torch.ScriptObject) and value._type().qualified_name().endswith("ProcessGroup"):
            return dist.ProcessGroup.unbox(value)
        if arg.name == "group_name" and isinstance(value, str):
            return _resolve_process_group(value)
    return None


def _group_ranks(func: Any, args: Any, kwargs: dict[str, Any]) -> list[int]:
    """Global ranks of the process group a collective runs on."""
    group = _process_group(func, args, kwargs)
    if group is None:
        raise ParallelError(f"{func} names no process group")
    return dist.get_process_group_ranks(group)


def gloo_input_copy(func: Any, args: Any, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The input of a collective run on the fake process group of which gloo, where it runs for real,
    holds a working copy that the step sees; None for any other operator or group.

    FSDP2's gradient reduce-scatter (``foreach_reduce`` -> ``dist.reduce_scatter_single``, synchronous) is
    ``c10d::_reduce_scatter_base_``.  gloo implements it as an all-reduce of a clone of the whole input
    (``ProcessGroupGloo::reduce_scatter_tensor_coalesced``: ``buffers.push_back(inputTensors[i].clone())``,
    the buffer captured by the returned ``LambdaWork``, whose ``wait()`` copies ``buffers[i].chunk(worldSize)
    [rank]`` into the output), so the clone lives until the Work is dropped, when
    ``reduce_scatter_single`` returns; its ``work.wait()`` runs that chunk and copy in this thread, where a
    storage tracker sees it.  NCCL (``ProcessGroupNCCL::_reduce_scatter_base``) runs ``ncclReduceScatter``
    from the input to the output, and the fake backend returns a completed Work: neither copies.  On 2 gloo
    ranks the copy, one block's gradients in the reduce dtype, was the peak of FSDP2 with
    MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (GPT +7.1%, Llama +6.5% over the recording
    without it; bench_fsdp's ``fsdp+bf16`` rows), where the bf16 activations and parameters leave the fp32
    gradient buffers the largest things alive; in fp32 the step peaks elsewhere."""
    if func.namespace != "c10d" or func._schema.name != "c10d::_reduce_scatter_base_":
        return None
    group = _process_group(func, args, kwargs)
    if group is None or dist.get_backend(group) != "fake":
        return None
    names = [arg.name for arg in func._schema.arguments]
    i = names.index("input_tensor")
    return args[i] if i < len(args) else kwargs["input_tensor"]


def _collective_seconds(target: Any, kind: str, func: Any, args: Any, kwargs: dict[str, Any],
                        out: Any) -> float:
    """`memviz.hardware.collectives.collective_seconds` of one collective on `target`'s interconnect, over the
    link its group crosses, for the full tensor: the largest of its arguments and its result (an
    all-gather's output, a reduce-scatter's input; a list argument counts its tensors together)."""
    ranks = _group_ranks(func, args, kwargs)
    interconnect = INTERCONNECTS[target.name]
    sizes = [sum(t.numel() * t.element_size() for t in pytree.tree_leaves(v) if isinstance(t, torch.Tensor))
             for v in (*args, *kwargs.values(), out)]
    return collective_seconds(kind, max(sizes), len(ranks), link_of(interconnect, ranks),
                              interconnect.base_latency)


def _classify(rec: _Recorder, grads: set[int], ends: set[int]) -> None:
    """Kinds of the data nodes the step created: a gradient shard left in ``.grad`` is a parameter
    gradient, FSDP2's collective buffers and unsharded parameters are communication, a forward tensor
    read by the backward is saved, a tensor still held after the step is an output."""
    for d, data in enumerate(rec.datas):
        if data.kind is not None:
            continue
        if d in grads:
            data.kind = DataKind.PARAMETER_GRADIENT
        elif data.comm:
            data.kind = DataKind.COMMUNICATION
        elif d in ends:
            data.kind = DataKind.OUTPUT
        elif data.phase is Phase.FORWARD:
            data.kind = DataKind.SAVED if Phase.BACKWARD in data.read_in else DataKind.ACTIVATION
        elif data.phase is Phase.BACKWARD:
            data.kind = DataKind.GRADIENT
        else:  # the optimizer update's temporaries (sqrt, div): transient like activations
            data.kind = DataKind.ACTIVATION


def recorded_graph(rec: _Recorder, name: str, grads: set[int]) -> tuple[Graph, Schedule]:
    """The CD-graph and the schedule exactly as the step ran (frees where storages were released);
    whatever is still alive afterwards is a graph output."""
    ends = set(rec.alive.values())
    _classify(rec, grads, ends)
    b = GraphBuilder(name)
    for data in rec.datas:
        b.data(data.name, data.nbytes, data.kind, shape=data.shape, dtype=data.dtype)
    for c in rec.computes:
        b.compute(c.name, c.inputs, c.outputs, op=c.op, phase=c.phase, time=c.time, module=c.module)
    created = {d for c in rec.computes for d in c.outputs}
    kept = (d for d in ends if d in created or rec.datas[d].kind is DataKind.PARAMETER_GRADIENT)
    b.outputs = sorted({*kept, *rec.token_ids})
    schedule = [Step(kind, i) for kind, i in rec.steps]
    # a source released during the step (an input the caller dropped) stays a legal free; any other
    # source is alive to the end, as the simulator assumes
    return b.build(), schedule


# --- sharding a model --------------------------------------------------------------------------------------
def blocks_of(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated blocks FSDP2 and tensor parallelism wrap: the children of the model's first (outermost)
    ``nn.ModuleList`` / ``nn.Sequential`` with two or more children."""
    for name, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2:
            prefix = f"{name}." if name else ""
            return [(f"{prefix}{child_name}", child) for child_name, child in m.named_children()]
    return []


#: Linear layers by their last name component (the naming of GPT-2, Llama/Mistral, BERT, T5, Megatron and
#: memviz's examples).  Column-wise: the first matmul of a pair (output features sharded); row-wise: the
#: second (input features sharded, partial sums all-reduced or reduce-scattered).
COLWISE = frozenset({"qkv", "c_attn", "q_proj", "k_proj", "v_proj", "query", "key", "value", "wq", "wk", "wv",
                     "fc", "fc1", "c_fc", "up_proj", "gate_proj", "w1", "w3", "wi", "dense_h_to_4h",
                     "query_key_value", "in_proj"})
ROWWISE = frozenset({"proj", "o_proj", "out_proj", "c_proj", "fc_proj", "fc2", "down_proj", "w2", "wo",
                     "dense_4h_to_h", "dense"})
#: Attributes holding a block's attention head count: divided by tp (each rank runs heads / tp heads).
HEAD_ATTRS = ("heads", "n_head", "n_heads", "num_heads", "num_attention_heads", "num_key_value_heads")


def is_norm(m: nn.Module) -> bool:
    """A LayerNorm / RMSNorm, torch's or a model's own class by its name (Hugging Face's LlamaRMSNorm,
    Qwen2RMSNorm, T5LayerNorm...).  Under sequence parallelism a norm left out runs on the local sequence
    shard and hands the attention a local tensor, whose shape (half the sequence) then disagrees with the
    full-length rotary tables and the gathered projections."""
    return isinstance(m, (nn.LayerNorm, nn.RMSNorm)) or type(m).__name__.endswith(("RMSNorm", "LayerNorm"))


def tp_plan(block: nn.Module, sp: bool) -> dict[str, Any]:
    """Megatron-style plan for one block from its Linear layers' names (`COLWISE`, `ROWWISE`); LayerNorm /
    RMSNorm layers run sequence-parallel when `sp`.  Any other Linear refuses the model."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    plan: dict[str, Any] = {}
    unknown = []
    for name, m in block.named_modules():
        last = name.rsplit(".", 1)[-1]
        if isinstance(m, nn.Linear):
            if last in COLWISE:
                plan[name] = ColwiseParallel(input_layouts=Shard(1)) if sp else ColwiseParallel()
            elif last in ROWWISE:
                plan[name] = RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()
            else:
                unknown.append(name)
        elif sp and is_norm(m):
            plan[name] = SequenceParallel()
    if unknown:
        raise ParallelError(
            f"tensor parallelism: no rule for the Linear layer(s) {unknown} of {type(block).__name__}; "
            f"memviz shards Linear layers named {sorted(COLWISE)} column-wise and {sorted(ROWWISE)} "
            "row-wise: rename them, or wrap the model with parallelize_module yourself and profile it "
            "without parallel=")
    if not any(isinstance(s, ColwiseParallel) for s in plan.values()):
        raise ParallelError(f"tensor parallelism: {type(block).__name__} has no column-wise Linear layer")
    return plan


def _divide_heads(block: nn.Module, tp: int) -> None:
    for m in block.modules():
        for attr in HEAD_ATTRS:
            heads = getattr(m, attr, None)
            if isinstance(heads, int) and not isinstance(heads, bool):
                if heads % tp:
                    raise ParallelError(f"{type(m).__name__}.{attr}={heads} is not divisible by tp={tp}")
                setattr(m, attr, heads // tp)


def tensor_parallelize(blocks: list[nn.Module], tp_mesh: Any, parallel: Parallel) -> None:
    """Megatron tensor parallelism inside each of `blocks` (`tp_plan`, head counts divided by tp) over
    `tp_mesh`; with `parallel.sp` the residual stream is split on the sequence from the first of `blocks`
    to the last, and whole again after it (the model's blocks, or one pipeline stage's)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput, parallelize_module

    for i, block in enumerate(blocks):
        plan = tp_plan(block, parallel.sp)
        _divide_heads(block, parallel.tp)
        parallelize_module(block, tp_mesh, plan)
        if parallel.sp:
            if i == 0:
                parallelize_module(block, tp_mesh, PrepareModuleInput(
                    input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True))
            if i == len(blocks) - 1:
                parallelize_module(block, tp_mesh, PrepareModuleOutput(
                    output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True))


def shard_model(model: nn.Module, parallel: Parallel, *, inplace: bool = False) -> nn.Module:
    """A sharded copy of `model` (`model` itself with `inplace`) on a mesh over the initialised process
    group: tensor parallelism inside every block (`tp_plan`), then ``fully_shard`` on every block and the
    root.  Without `inplace` the user's model is not touched."""
    from torch.distributed.device_mesh import init_device_mesh

    blocks = blocks_of(model)
    if not blocks:
        raise ParallelError(f"{type(model).__name__} has no nn.ModuleList / nn.Sequential of blocks to shard")
    work = model if inplace else copy.deepcopy(model)
    blocks = blocks_of(work)
    if parallel.tp > 1 and parallel.dp > 1:
        mesh = init_device_mesh("cpu", (parallel.dp, parallel.tp), mesh_dim_names=("dp", "tp"))
        dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    elif parallel.tp > 1:
        dp_mesh, tp_mesh = None, init_device_mesh("cpu", (parallel.tp,), mesh_dim_names=("tp",))
    else:
        dp_mesh, tp_mesh = init_device_mesh("cpu", (parallel.dp,), mesh_dim_names=("dp",)), None
    if tp_mesh is not None:
        tensor_parallelize([block for _, block in blocks], tp_mesh, parallel)
    if dp_mesh is not None:
        from torch.distributed.fsdp import fully_shard

        for _, block in blocks:
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=parallel.reshard_after_forward)
        fully_shard(work, mesh=dp_mesh)
    return work


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int) -> Iterator[None]:
    """PyTorch's fake process group as the default group for the duration (this process plays `rank`)."""
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise ParallelError(
                f"a process group of world size {dist.get_world_size()} (rank {dist.get_rank()}) is already "
                f"initialised, not {world_size} (rank {rank}): wrap the model with fully_shard / "
                "parallelize_module yourself and profile it without parallel=, or destroy the group first")
        yield
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _forget_sharding_propagation()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        _forget_sharding_propagation()


def _forget_sharding_propagation() -> None:
    """Empty DTensor's sharding-propagation caches (Python and C++).  They key on the operator's specs, whose
    DeviceMesh compares by layout and dimension names, not by this process's rank or its groups; an entry
    from another world hands back output specs on that world's mesh.  Profiling ranks 0, 1 and 2 of a
    dp=2 x tp=2 job in one process failed on rank 2 (its tp group is not rank 0's) with "Could not resolve
    the process group registered under the name 3"."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()


# --- one rank's step ----------------------------------------------------------------------------------------
def as_on_target(optimizer: Any, target: Any) -> Any:
    """`optimizer` as `target` runs it.  An estimated step runs on fake CPU tensors, where torch.optim's
    default update (``foreach`` and ``fused`` unset) is the CPU's per-parameter loop; a CUDA target runs the
    foreach update, whose list temporaries (AdamW's ``exp_avg_sq.sqrt()`` of every parameter in the group)
    are alive at once (`memviz.profiling.profile.update_kind`, the non-parallel path's rule).  Then this is
    the same class and hyper-parameters with ``foreach=True``, over a stand-in parameter: `make_optimizer`
    carries them over to the sharded model's parameters.  Anything else is returned as it is."""
    from memviz.hardware.devices import named_device
    from memviz.profiling.profile import optimizer_hyper, update_kind

    cls, hyper = optimizer_hyper(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    if "foreach" not in accepted or hyper.get("foreach") is not None or hyper.get("fused"):
        return optimizer
    if update_kind(optimizer, named_device(f"fake:{target.name}")) != "foreach":
        return optimizer
    kept = {k: v for k, v in hyper.items() if k in accepted}
    return cls([torch.zeros(1, requires_grad=True)], **{**kept, "foreach": True})


def make_optimizer(optimizer: Any, model: nn.Module) -> torch.optim.Optimizer | None:
    """`optimizer` over `model`'s (sharded) parameters: an instance already over them is used as is; a class,
    or an instance over other parameters (the user's unsharded model), gives the same class and
    hyper-parameters over these."""
    return _optimizer_over(optimizer, list(model.parameters()))


def _optimizer_over(optimizer: Any, params: list[torch.Tensor]) -> torch.optim.Optimizer | None:
    if optimizer is None:
        return None
    if isinstance(optimizer, torch.optim.Optimizer):
        mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if mine == {id(p) for p in params}:
            return optimizer
        accepted = inspect.signature(type(optimizer).__init__).parameters
        hyper = {k: v for k, v in optimizer.param_groups[0].items() if k != "params" and k in accepted}
        return type(optimizer)(params, **hyper)
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return optimizer(params)
    raise TypeError(f"optimizer must be a torch.optim.Optimizer class or instance, not {optimizer!r}")


def local_shard_optimizer(optimizer: Any, model: nn.Module) -> torch.optim.Optimizer | None:
    """`make_optimizer` over the local shards of `model`'s parameters (a DTensor's local tensor, a plain
    parameter itself), each lent its parameter's local gradient for the duration of a step.  For a parameter
    whose gradient has its placements (checked at each step), DTensor runs the update as the same operators
    on the local shards, so the recorded update is the same; what this saves is DTensor's dispatch and its
    sharding propagation of each foreach operator over every parameter, which no cache spares the one
    update an estimated step runs before its recording (2.7 of a Llama-3-8B rank's 8.2 CPU seconds)."""
    params = list(model.parameters())
    shards = [local(p) for p in params]
    opt = _optimizer_over(optimizer, shards)
    if opt is None:
        return None

    def lend(*_: Any) -> None:
        for p, shard in zip(params, shards, strict=True):
            if p.grad is not None and getattr(p.grad, "placements", None) != getattr(p, "placements", None):
                raise ParallelError(f"a gradient placed {p.grad.placements} on a parameter placed "
                                    f"{getattr(p, 'placements', None)}: not an update of the local shards")
            shard.grad = None if p.grad is None else local(p.grad)

    def take_back(*_: Any) -> None:
        for shard in shards:
            shard.grad = None

    opt.register_step_pre_hook(lend)
    opt.register_step_post_hook(take_back)
    return opt


def train_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, mode: str,
               loss_fn: Callable[[Any], torch.Tensor], opt: torch.optim.Optimizer | None,
               phase: Callable[[Phase], None] = lambda p: None) -> Callable[[], Any]:
    """One step as the user runs it (forward, loss, backward, optimizer step, gradients set to None before
    the step); `phase` is told when the backward and the optimizer start."""

    def step() -> Any:
        if mode == "inference":
            with torch.no_grad():
                return model(*args, **(kwargs or {}))
        phase(Phase.FORWARD)
        out = model(*args, **(kwargs or {}))
        loss = loss_fn(out)
        phase(Phase.BACKWARD)
        loss.backward()
        if opt is not None:
            phase(Phase.OPTIMIZER)
            opt.step()
        return out, loss

    return step


def _sources(model: nn.Module, args: Any, kwargs: Any, opt: Any) -> dict[str, list[tuple[str, torch.Tensor]]]:
    params = [(n, local(p)) for n, p in model.named_parameters()]
    grads = [(f"{n}.grad", local(p.grad)) for n, p in model.named_parameters() if p.grad is not None]
    state = [] if opt is None else [
        (f"optimizer_state.{i}.{k}", local(v)) for i, s in enumerate(opt.state.values()) for k, v in s.items()
        if isinstance(v, torch.Tensor)]
    inputs = [(f"input{i}", local(t)) for i, t in enumerate(pytree.tree_leaves((args, kwargs or {})))
              if isinstance(t, torch.Tensor)]
    return {"parameter": params, "buffer": [(n, local(b)) for n, b in model.named_buffers()],
            "input": inputs, "optimizer_state": state, "parameter_gradient": grads}


def record_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, *, mode: str,
                loss_fn: Callable[[Any], torch.Tensor], optimizer: Any, fake_mode: Any = None,
                target: Any = None, quick: bool = False) -> tuple[Graph, Schedule, int | None]:
    """Record one step of an already sharded `model` on the current process group: (graph, schedule as it
    ran, measured live-storage peak of a second, unrecorded run of the same step; None for an estimated
    step, whose tensors are `fake_mode`'s and whose operator times come from `target`'s roofline).

    One step runs first, unrecorded: the steady state, where the optimizer's state exists and one-time
    work (lazy initialisation, DTensor's cached sharding propagation) is done; gradients are set to None
    before each step, as ``zero_grad()`` does.  `quick`: the steady state from `_prime_optimizer` instead of a
    first step, and no measured run (None): the per-rank planner's candidates, each a variant of a
    profile whose prediction was measured."""
    opt = (make_optimizer if fake_mode is None else local_shard_optimizer)(optimizer, model)
    step = train_step(model, args, kwargs, mode, loss_fn, opt)
    with torch.random.fork_rng():
        if (fake_mode is not None or quick) and mode == "train" and opt is not None:
            _prime_optimizer(model, opt)
        else:
            step()
        _zero(model, opt)
        gc.collect()
        rec = _Recorder(_sources(model, args, kwargs, opt), fake_mode, target)
        step = train_step(model, args, kwargs, mode, loss_fn, opt, phase=lambda p: setattr(rec, "phase", p))
        with rec.modules, _resize_hook(rec._resized), _unrecorded_sharding_propagation(rec), rec:
            result = step()
        grads = {rec.alive[local(p.grad).untyped_storage()._cdata] for p in model.parameters()
                 if p.grad is not None and local(p.grad).untyped_storage()._cdata in rec.alive}
        graph, schedule = recorded_graph(rec, type(model).__name__, grads)
        del result
        _zero(model, opt)
        if fake_mode is not None or quick:
            return graph, schedule, None
        gc.collect()
        tracker = ShardedStorageTracker(local_tensors(model, opt, (args, kwargs)))
        with tracker:
            result = train_step(model, args, kwargs, mode, loss_fn, opt)()
        del result
        _zero(model, opt)
    return graph, schedule, tracker.peak_bytes


def _prime_optimizer(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """The steady state for an estimated step without a first step: the optimizer's state made by one
    update on zero gradients.  On fake tensors each operator costs the same at any size, and a whole
    warm-up step was 40% of a Llama-3-8B rank's profile; FSDP2's lazy initialisation allocates nothing
    the step keeps, so the recorded step (its first) holds what the steady state holds."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()


def _record_estimated(work: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, *, mode: str,
                      loss_fn: Callable[[Any], torch.Tensor], optimizer: Any,
                      target: Any) -> tuple[Graph, Schedule, None]:
    """`record_step` without memory: the sharded model's parameters and buffers become fake tensors
    (``to_empty`` under a FakeTensorMode, FSDP2's meta-device initialisation path), the inputs fake tensors
    of the same shapes, and the step runs on them: exact local shapes and allocation order, no weights
    allocated (a Llama-3-8B rank holds none of its gigabytes), operator times from `target`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memviz.profiling.capture import eager_attention_masks

    # non-fake inputs allowed: a model given with real weights has them replaced by empty fake tensors here;
    # Hugging Face's mask decisions are answered as on real tensors (the user's `args`: its example values)
    with FakeTensorMode(allow_non_fake_inputs=True) as fake, _value_reads_refused(work, args, kwargs), \
            eager_attention_masks(work, args, kwargs, fake=True), _older_objects_frozen():
        work.to_empty(device="cpu")
        fake_args, fake_kwargs = pytree.tree_map_only(
            torch.Tensor, lambda t: torch.zeros(t.shape, dtype=t.dtype), (args, kwargs))
        return record_step(work, fake_args, fake_kwargs, mode=mode, loss_fn=loss_fn, optimizer=optimizer,
                           fake_mode=fake, target=target)


@contextlib.contextmanager
def _older_objects_frozen() -> Iterator[None]:
    """``gc.freeze()`` for the duration: the objects that exist now (the model, transformers and torch
    themselves: ~0.5M objects for a Llama-3-8B rank) are left out of every collection, explicit or automatic,
    until the block ends, when ``gc.unfreeze()`` gives them back to the oldest generation.  The step's own
    objects (its tensors, autograd graph, hooks) are collected as before, so the frees the recorder sees do
    not move; the collections were 1.15 of an 8B rank's 10.9 CPU seconds, mostly traversing those old
    objects.  A process that froze objects itself is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _value_reads_refused(model: nn.Module, args: tuple[Any, ...],
                         kwargs: dict[str, Any] | None) -> Iterator[None]:
    """A step on fake tensors that reads a tensor's value (``bool(t)``, ``t.item()``: transformers reading a
    padding mask to decide whether it needs a causal mask) has none to read: a `ParallelError` naming the
    step's tensor inputs and the code that read, instead of the fake-tensor internals."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    try:
        yield
    except DataDependentOutputException as err:
        try:
            bound = inspect.signature(model.forward).bind_partial(*args, **(kwargs or {})).arguments
        except (TypeError, ValueError):
            bound = {**{f"args[{i}]": a for i, a in enumerate(args)}, **(kwargs or {})}
        names = [k for k, v in bound.items() if pytree.tree_any(lambda x: isinstance(x, torch.Tensor), v)]
        frames = [f for f in traceback.extract_tb(err.__traceback__) if "/torch/" not in f.filename]
        where = f"{frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})" if frames else "the step"
        raise ParallelError(
            f"the estimated step (device='fake:...') reads the values of a tensor at {where}, but it runs on "
            f"fake tensors of the inputs' shapes ({', '.join(names)}), which hold none; the branch would "
            "depend on your inputs' values.  Give no input whose values the model reads (Hugging Face: no "
            "attention_mask when it is all ones), or profile on CPU without device='fake:...'") from err


@contextlib.contextmanager
def _restored(model: nn.Module, optimizer: Any) -> Iterator[None]:
    """Put back the local shards of parameters and buffers, the gradients and the optimizer's state after
    the block: profiling runs real steps on a model the user wrapped, which must not change it."""
    tensors = [local(t) for t in (*model.parameters(), *model.buffers())]
    saved = [t.detach().clone() for t in tensors]
    grads = [p.grad for p in model.parameters()]
    opt_state = (copy.deepcopy(optimizer.state_dict()) if isinstance(optimizer, torch.optim.Optimizer)
                 else None)
    try:
        yield
    finally:
        with torch.no_grad():
            for t, s in zip(tensors, saved, strict=True):
                t.copy_(s)
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g
        if opt_state is not None:
            optimizer.load_state_dict(opt_state)


def _zero(model: nn.Module, opt: torch.optim.Optimizer | None) -> None:
    if opt is not None:
        opt.zero_grad(set_to_none=True)
    for p in model.parameters():  # a `local_shard_optimizer`'s parameters are not the model's
        p.grad = None


def meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` whose parameters and buffers are on the meta device (shapes, dtypes and
    ``requires_grad`` kept, no data copied)."""
    memo: dict[int, Any] = {}
    for t in (*model.parameters(), *model.buffers()):
        empty = torch.empty_like(t, device="meta")
        is_param = isinstance(t, nn.Parameter)
        memo[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if is_param else empty
    return copy.deepcopy(model, memo)


def record_parallel(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                    parallel: Parallel | None, *, mode: str, loss_fn: Callable[[Any], torch.Tensor],
                    optimizer: Any, target: Any = None, regions: list[dict[str, Any]] = (),
                    quick: bool = False) -> tuple[Graph, Schedule, int | None]:
    """`record_step` of one rank: `model` sharded as `parallel` says on the fake process group (its copy:
    the user's model is not touched), or, `parallel` None, the model the user wrapped, as it is on the
    initialised group (its state restored afterwards).  `target`: estimate on fake tensors with its
    roofline times.  `regions`: `memviz.apply`'s checkpointed regions (plan specs), applied before the
    model is sharded, as a user applies a plan and then wraps the model (on a model the user wrapped:
    applied for the step and removed again).  `quick`: `record_step`'s."""
    from memviz.runtime.apply import unwrap_module, wrap

    if target is not None and optimizer is not None:
        optimizer = as_on_target(optimizer, target)
    if parallel is not None and parallel.pp > 1:
        from memviz.parallel.pipeline import record_stage

        if kwargs or mode != "train":
            raise ParallelError("a pipeline stage is recorded for a training step on positional inputs only")
        if target is not None:
            raise ParallelError("a pipeline stage is recorded on CPU: estimated (device='fake:...') pipeline "
                                "stages are not modelled")
        if regions and parallel.tp == 1:
            raise ParallelError("plans of a pipeline stage are made under pipeline x tensor parallelism only "
                                "(its stages keep the model's eager blocks; torch's traced split does not)")
        return record_stage(model, args, parallel, loss_fn=loss_fn, optimizer=optimizer, regions=regions,
                            quick=quick)
    if parallel is None:
        with _restored(model, optimizer):  # the steps run on the user's own model and optimizer
            wrapped = []
            try:
                for spec in regions:
                    wrap(model.get_submodule(spec["module"]), spec)
                    wrapped.append(model.get_submodule(spec["module"]))
                return record_step(model, args, kwargs, mode=mode, loss_fn=loss_fn, optimizer=optimizer,
                                   quick=quick)
            finally:
                for module in wrapped:  # only these: a region the user checkpointed stays checkpointed
                    unwrap_module(module)
    with fake_process_group(parallel.world_size, parallel.rank):
        # an estimated step replaces the weights with fake tensors: a copy without them costs nothing
        work = meta_copy(model) if target is not None else copy.deepcopy(model)
        for spec in regions:
            wrap(work.get_submodule(spec["module"]), spec)
        work = shard_model(work, parallel, inplace=True)
        try:
            if target is not None:
                return _record_estimated(work, args, kwargs, mode=mode, loss_fn=loss_fn, optimizer=optimizer,
                                         target=target)
            return record_step(work, args, kwargs, mode=mode, loss_fn=loss_fn, optimizer=optimizer,
                               quick=quick)
        except RuntimeError as err:
            if parallel.tp == 1:
                raise
            raise ParallelError(
                f"{type(model).__name__}'s forward fails on tensor-parallel local shapes ({err}).  "
                f"memviz divides the head-count attributes {HEAD_ATTRS} by tp; the forward must take "
                "every other width from its tensors (reshape(b, t, -1), not reshape(b, t, d) with the "
                "full d)") from err


def profile_parallel(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, *, mode: str,
                     loss_fn: Callable[[Any], torch.Tensor] | None, optimizer: Any, device: Any,
                     parallel: Parallel | None) -> Any:
    """`memviz.profile` for one rank of a parallel step (module docstring).  `parallel` None: `model` is
    already wrapped (fully_shard / parallelize_module) on an initialised process group, profiled as is."""
    from memviz.hardware.devices import resolve_device
    from memviz.profiling.capture import default_loss, fingerprint
    estimated = isinstance(device, str) and device.startswith("fake:")
    if device not in (None, "cpu") and str(device) != "cpu" and not estimated:
        raise ParallelError(f"parallel profiles are recorded on CPU (fake process group) or estimated for a "
                            f"target (device='fake:h100' ...), not on {device!r}")
    info = resolve_device(device if estimated else "cpu", model, args)
    if parallel is None:
        if estimated:
            raise ParallelError("an estimated parallel profile shards the model itself: pass the unwrapped "
                                "model (on the meta device for large shapes) with parallel=Parallel(...)")
        if not dist.is_initialized():
            raise ParallelError("the model holds DTensor parameters but no process group is initialised")
        meta = {"world_size": dist.get_world_size(), "rank": dist.get_rank(), "wrapped_by_user": True}
    else:
        if is_parallel_model(model):
            raise ParallelError("the model is already sharded: profile it without parallel=")
        meta = {**parallel.to_dict(), "wrapped_by_user": False}
    graph, schedule, measured = record_parallel(model, args, kwargs, parallel, mode=mode,
                                                loss_fn=loss_fn or default_loss, optimizer=optimizer,
                                                target=info.target if estimated else None)
    graph = Graph(graph.computes, graph.datas, graph.outputs, name=type(model).__name__,
                  meta={"mode": mode, "estimated": estimated, "device": info.name, "recorded": True,
                        "parallel": meta, **({"optimizer": type(optimizer).__name__ if not isinstance(
                            optimizer, type) else optimizer.__name__} if optimizer is not None else {})})
    baseline = simulate(graph, schedule).check()
    if measured is not None:
        _check_measured(baseline.peak_bytes, measured, False)
    prof = ParallelProfile(graph=graph, baseline=baseline, baseline_schedule=schedule,
                           measured_peak_bytes=measured, device=info, mode=mode,
                           model_name=type(model).__name__,
                           fingerprint=fingerprint(model, args, kwargs, mode), captured=None, model=model,
                           loss_fn=loss_fn, optimizer=optimizer)
    prof.parallel = parallel
    prof.inputs = (args, kwargs)
    return prof


class ParallelProfile(Profile):
    """A `memviz.profiling.profile.Profile` of one rank of a parallel step; `parallel` is the `Parallel` it
    ran as (None: a model the user wrapped).  Recorded, not captured: `memviz.export` refuses it."""

    parallel: Parallel | None = None
    inputs: tuple[tuple[Any, ...], dict[str, Any] | None] = ((), None)  # (args, kwargs) it ran on
    not_exportable = (
        "this plan comes from a recorded parallel (FSDP2 / tensor-parallel) profile: memviz.export runs a "
        "captured FX program, and FSDP2's hooks and storage resizes cannot be captured.  Plan this rank with "
        "memviz.plan(profile, budget, strategy='sac') and run the plan with memviz.apply(plan, model) "
        "before fully_shard / parallelize_module (PyTorch's own checkpointing, which composes with both)")
