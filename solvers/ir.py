"""The computation/data graph (CD-graph) every memviz component speaks.

A *compute node* is one operation (its time, transient workspace and the module/source line it came
from); a *data node* is one tensor storage with its exact byte size.  Views and in-place results are
merged into the data node of the storage they alias, so a tensor and its views live and die together
(Rockmate, Sec. 3.2 and Appendix A).  The graph is immutable: solvers return schedules over it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from functools import cached_property
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from typing import Any


class Phase(str, Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class DataKind(str, Enum):
    PARAMETER = "parameter"
    BUFFER = "buffer"
    INPUT = "input"
    ACTIVATION = "activation"
    SAVED = "saved"  # activation the backward pass reads (saved for backward)
    GRADIENT = "gradient"
    PARAMETER_GRADIENT = "parameter_gradient"
    OPTIMIZER_STATE = "optimizer_state"
    OUTPUT = "output"
    COMMUNICATION = "communication"  # collective buffers and gathered (unsharded) parameters of one rank


#: members by value: a plan file's 100k nodes are looked up here (`Enum(value)` costs ten times more);
#: a value that is not here goes through the Enum, which raises the usual ValueError
_PHASES = {p.value: p for p in Phase}
_KINDS = {k.value: k for k in DataKind}

#: Kinds whose bytes are fixed for the whole run: a remat plan cannot touch them.
PERSISTENT_KINDS = frozenset({DataKind.PARAMETER, DataKind.BUFFER, DataKind.INPUT, DataKind.OPTIMIZER_STATE})


@dataclass(frozen=True)
class ComputeNode:
    id: int
    name: str
    op: str
    phase: Phase
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    time: float = 0.0
    temp_bytes: int = 0
    module: str = ""
    source: str = ""
    block: int | None = None
    flops: float = 0.0
    #: inputs this node overwrites in place: a gradient summed into the buffer of its first
    #: contribution, as autograd's input buffer accumulates (`simulate` runs such a node once and lets
    #: nothing produce what it wrote again; the written storage holds the sum, the node's own output
    #: is a 0-byte token)
    mutates: tuple[int, ...] = ()


@dataclass(frozen=True)
class DataNode:
    id: int
    name: str
    bytes: int
    kind: DataKind
    producer: int | None = None
    shape: tuple[int, ...] = ()
    dtype: str = ""
    aliases: tuple[str, ...] = ()


class GraphError(ValueError):
    """The graph itself is malformed (dangling ids, cycles, double producers)."""


@dataclass(frozen=True)
class Graph:
    """A CD-graph: compute nodes in capture (eager) order and the data nodes they read and write.

    `outputs` are the data nodes that must be alive when a schedule ends (loss, parameter gradients,
    updated parameters, optimizer state, model outputs).  Data nodes without a producer (parameters,
    buffers, inputs) are alive when the schedule starts.
    """

    computes: tuple[ComputeNode, ...]
    datas: tuple[DataNode, ...]
    outputs: tuple[int, ...]
    name: str = "graph"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    _consumers: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self._plainly_well_formed():
            self._check_each_node()
        consumers: list[list[int]] = [[] for _ in self.datas]
        for c in self.computes:
            for d in dict.fromkeys(c.inputs):
                consumers[d].append(c.id)
        object.__setattr__(self, "_consumers", tuple(map(tuple, consumers)))
        self._check_acyclic()

    def _plainly_well_formed(self) -> bool:
        """The checks of `_check_each_node` in C loops over whole columns (a large plan file is rebuilt
        through here); False sends a graph to `_check_each_node`, which names what is wrong."""
        computes, datas = self.computes, self.datas
        n_data = len(datas)
        producers = list(map(attrgetter("producer"), datas))
        refs = [*chain.from_iterable(map(attrgetter("inputs"), computes)),
                *chain.from_iterable(map(attrgetter("outputs"), computes)), *self.outputs]
        if not (
            list(map(attrgetter("id"), computes)) == list(range(len(computes)))
            and list(map(attrgetter("id"), datas)) == list(range(n_data))
            and min(map(attrgetter("bytes"), datas), default=0) >= 0
            and set(map(type, refs)) <= {int}
            and (not refs or 0 <= min(refs) <= max(refs) < n_data)
            and all(set(c.mutates) <= set(c.inputs) for c in computes if c.mutates)
        ):
            return False
        # each data node names as producer exactly the compute node that outputs it
        made_by: list[int | None] = [None] * n_data
        for c in computes:
            for d in c.outputs:
                made_by[d] = c.id
        return made_by == producers and sum(map(len, map(attrgetter("outputs"), computes))) == (
            n_data - producers.count(None)
        )

    def _check_each_node(self) -> None:
        for i, c in enumerate(self.computes):
            if c.id != i:
                raise GraphError(f"compute node {c.name!r} has id {c.id}, expected {i}")
        for i, d in enumerate(self.datas):
            if d.id != i:
                raise GraphError(f"data node {d.name!r} has id {d.id}, expected {i}")
            if d.bytes < 0:
                raise GraphError(f"data node {d.name!r} has negative size {d.bytes}")
        n_data = len(self.datas)
        for c in self.computes:
            for d in (*c.inputs, *c.outputs):
                if not 0 <= d < n_data:
                    raise GraphError(f"compute node {c.name!r} refers to unknown data id {d}")
            for d in c.mutates:
                if d not in c.inputs:
                    raise GraphError(f"compute node {c.name!r} writes data id {d} in place but does not "
                                     "read it")
            for d in c.outputs:
                if self.datas[d].producer != c.id:
                    raise GraphError(
                        f"data node {self.datas[d].name!r} is an output of {c.name!r} "
                        f"but names producer {self.datas[d].producer}"
                    )
        for d in self.datas:
            if d.producer is not None and d.id not in self.computes[d.producer].outputs:
                raise GraphError(f"data node {d.name!r} names producer {d.producer} which does not output it")
        for d in self.outputs:
            if not 0 <= d < n_data:
                raise GraphError(f"graph output refers to unknown data id {d}")

    def _check_acyclic(self) -> None:
        producer = [d.producer for d in self.datas]
        if all(producer[d] is None or producer[d] < c.id for c in self.computes for d in c.inputs):
            return  # every edge runs from an earlier node to a later one (capture order): no cycle
        self._check_acyclic_kahn()

    def _check_acyclic_kahn(self) -> None:
        """Kahn's algorithm over compute nodes; data nodes have one producer so they add no cycles."""
        indeg = [len({self.datas[d].producer for d in c.inputs} - {None}) for c in self.computes]
        ready = [c.id for c in self.computes if indeg[c.id] == 0]
        seen = 0
        while ready:
            cid = ready.pop()
            seen += 1
            for succ in self.successors(cid):
                indeg[succ] -= 1
                if indeg[succ] == 0:
                    ready.append(succ)
        if seen != len(self.computes):
            raise GraphError("the compute graph has a cycle")

    # --- queries ---------------------------------------------------------------------------
    def consumers(self, data_id: int) -> tuple[int, ...]:
        return self._consumers[data_id]

    def successors(self, compute_id: int) -> list[int]:
        """Compute nodes reading any output of `compute_id` (deduplicated, ascending)."""
        return sorted({u for d in self.computes[compute_id].outputs for u in self._consumers[d]})

    def predecessors(self, compute_id: int) -> list[int]:
        preds = {self.datas[d].producer for d in self.computes[compute_id].inputs}
        return sorted(p for p in preds if p is not None)

    def sources(self) -> list[int]:
        """Data nodes alive at the start (no producer)."""
        return [d.id for d in self.datas if d.producer is None]

    def persistent_bytes(self) -> int:
        return sum(d.bytes for d in self.datas if d.producer is None)

    @cached_property
    def required_computes(self) -> frozenset[int]:
        """Compute nodes that some required output depends on, and those producing nothing (all of them,
        for captured graphs).  A compute without outputs is there for its effect alone -- the optimizer
        updates parameters and state in place -- so it must run: a schedule without it would plan a step
        whose optimizer memory nobody counted while the user's optimizer still runs."""
        need: set[int] = set()
        stack = [self.datas[d].producer for d in self.outputs]
        stack += [c.id for c in self.computes if not c.outputs]
        while stack:
            c = stack.pop()
            if c is None or c in need:
                continue
            need.add(c)
            stack.extend(self.datas[d].producer for d in self.computes[c].inputs)
        return frozenset(need)

    def is_topological(self, order: Sequence[int]) -> bool:
        pos = {c: i for i, c in enumerate(order)}
        if len(pos) != len(self.computes) or len(order) != len(self.computes):
            return False
        return all(pos[p] < pos[c.id] for c in self.computes for p in self.predecessors(c.id))

    # --- serialisation (the plan JSON's "graph" member) -----------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "computes": [
                {
                    "id": c.id,
                    "name": c.name,
                    "op": c.op,
                    "phase": c.phase.value,
                    "inputs": list(c.inputs),
                    "outputs": list(c.outputs),
                    "time": c.time,
                    "temp_bytes": c.temp_bytes,
                    "module": c.module,
                    "source": c.source,
                    "block": c.block,
                    "flops": c.flops,
                    # only where there is one: a plan file's 100k computes carry no empty lists
                    **({"mutates": list(c.mutates)} if c.mutates else {}),
                }
                for c in self.computes
            ],
            "datas": [
                {
                    "id": d.id,
                    "name": d.name,
                    "bytes": d.bytes,
                    "kind": d.kind.value,
                    "producer": d.producer,
                    "consumers": list(self.consumers(d.id)),
                    "shape": list(d.shape),
                    "dtype": d.dtype,
                    "aliases": list(d.aliases),
                }
                for d in self.datas
            ],
            "outputs": list(self.outputs),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Graph:
        # column by column (`map` over the node class): a plan file's graph has 100k nodes
        cs, ds = obj["computes"], obj["datas"]
        computes = _frozen_nodes(
            ComputeNode,
            _column(cs, "id"),
            _column(cs, "name"),
            _column(cs, "op"),
            _members(_PHASES, Phase, _column(cs, "phase")),
            map(tuple, _column(cs, "inputs")),
            map(tuple, _column(cs, "outputs")),
            map(float, _column(cs, "time")),
            map(int, _column(cs, "temp_bytes")),
            _column(cs, "module", ""),
            _column(cs, "source", ""),
            _column(cs, "block", None),
            map(float, _column(cs, "flops", 0.0)),
            map(tuple, _column(cs, "mutates", ())),
        )
        datas = _frozen_nodes(
            DataNode,
            _column(ds, "id"),
            _column(ds, "name"),
            map(int, _column(ds, "bytes")),
            _members(_KINDS, DataKind, _column(ds, "kind")),
            _column(ds, "producer", None),
            map(tuple, _column(ds, "shape", ())),
            _column(ds, "dtype", ""),
            map(tuple, _column(ds, "aliases", ())),
        )
        return cls(
            computes,
            datas,
            tuple(obj["outputs"]),
            name=obj.get("name", "graph"),
            meta=dict(obj.get("meta", {})),
        )


def _column(items: list[dict[str, Any]], key: str, *default: Any) -> Iterable[Any]:
    """item[key] of each item (KeyError if one lacks it), or item.get(key, default)."""
    if default:
        return map(dict.get, items, repeat(key), repeat(default[0]))
    return map(itemgetter(key), items)


def _members(by_value: dict[str, Any], enum: type[Enum], values: Iterable[Any]) -> list[Any]:
    """The enum members of `values`, looked up in one C loop; a value that is not a member goes through
    the Enum, which raises its usual ValueError."""
    values = list(values)
    try:
        return list(map(by_value.__getitem__, values))
    except (KeyError, TypeError):
        return list(map(enum, values))


def _frozen_nodes(cls: type, *columns: Iterable[Any]) -> tuple[Any, ...]:
    """Instances of the frozen dataclass `cls` (fields in order, no __post_init__) from columns of field
    values.  Its generated __init__ sets each field through object.__setattr__ (frozen), half the cost
    of rebuilding a plan file's 100k nodes; filling the instance dict is what that __init__ ends with."""
    names = tuple(f.name for f in fields(cls))
    new = object.__new__

    def node(values: tuple[Any, ...]) -> Any:
        made = new(cls)
        made.__dict__.update(zip(names, values, strict=True))
        return made

    return tuple(map(node, zip(*columns, strict=True)))


class GraphBuilder:
    """Incremental construction with automatic ids; used by capture and by tests."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self._computes: list[dict[str, Any]] = []
        self._datas: list[dict[str, Any]] = []
        self.outputs: list[int] = []

    def data(self, name: str, nbytes: int, kind: DataKind | str = DataKind.ACTIVATION, **kw: Any) -> int:
        self._datas.append({"name": name, "bytes": int(nbytes), "kind": DataKind(kind), **kw})
        return len(self._datas) - 1

    def compute(
        self,
        name: str,
        inputs: Iterable[int],
        outputs: Iterable[int],
        *,
        op: str | None = None,
        phase: Phase | str = Phase.FORWARD,
        **kw: Any,
    ) -> int:
        cid = len(self._computes)
        outs = tuple(outputs)
        for d in outs:
            if self._datas[d].get("producer") is not None:
                raise GraphError(f"data node {self._datas[d]['name']!r} already has a producer")
            self._datas[d]["producer"] = cid
        self._computes.append(
            {
                "name": name,
                "op": op or name,
                "phase": Phase(phase),
                "inputs": tuple(inputs),
                "outputs": outs,
                **kw,
            }
        )
        return cid

    def build(self, **meta: Any) -> Graph:
        return Graph(
            tuple(ComputeNode(id=i, **c) for i, c in enumerate(self._computes)),
            tuple(DataNode(id=i, **d) for i, d in enumerate(self._datas)),
            tuple(self.outputs),
            name=self.name,
            meta=meta,
        )


def with_order_chain(graph: Graph, ordered: Sequence[int], label: str = "rng order") -> Graph:
    """`graph` with the first executions of `ordered` (ascending compute ids) forced into that order.

    Between each pair of consecutive nodes a 0-byte *token* data node is added: an output of the
    earlier node, an input of the later one and a required graph output.  Every schedule `simulate`
    accepts reads each input while it is alive, and a token is alive only after its single producer
    ran, so the earlier node's first execution comes first: every solver that returns a valid schedule
    respects the order, with no solver knowing about it.  Being required outputs of 0 bytes, tokens
    are never worth freeing, so recomputing a later node never forces recomputing an earlier one
    (Rockmate's chain counts forward-produced required outputs as resident, checkmate keeps them
    once produced, OLLA charges them nothing).

    memviz uses it for random operators: the CPU generator (like each accelerator's) is one stream,
    so the order in which operators first draw from it decides every random mask; the exported module
    saves each operator's RNG state at its first execution and replays it for recomputations, which is
    only eager's mask if the first executions run in eager (capture) order.

    Token data nodes are appended after the existing ones, so every other id is unchanged."""
    ids = list(ordered)
    for c in ids:
        if not 0 <= c < len(graph.computes):
            raise GraphError(f"order chain names unknown compute id {c}")
    pairs = list(zip(ids, ids[1:], strict=False))
    if any(b <= a for a, b in pairs):
        raise GraphError(f"order chain must list compute ids in ascending (capture) order, got {ids}")
    if not pairs:
        return graph
    n = len(graph.datas)
    extra_in: dict[int, tuple[int, ...]] = {}
    extra_out: dict[int, tuple[int, ...]] = {}
    tokens = []
    for k, (a, b) in enumerate(pairs):
        name = f"{label}: {graph.computes[a].name} -> {graph.computes[b].name}"
        tokens.append(DataNode(id=n + k, name=name, bytes=0, kind=DataKind.ACTIVATION, producer=a))
        extra_out[a] = (n + k,)
        extra_in[b] = (n + k,)
    computes = tuple(replace(c, inputs=c.inputs + extra_in.get(c.id, ()),
                             outputs=c.outputs + extra_out.get(c.id, ()))
                     for c in graph.computes)
    return Graph(computes, (*graph.datas, *tokens), (*graph.outputs, *(t.id for t in tokens)),
                 name=graph.name, meta=dict(graph.meta))
