"""The computation/data graph (CD-graph) every memviz component speaks.

A *compute node* is one operation (its time, transient workspace and the module/source line it came
from); a *data node* is one tensor storage with its exact byte size.  Views and in-place results are
merged into the data node of the storage they alias, so a tensor and its views live and die together
(Rockmate, Sec. 3.2 and Appendix A).  The graph is immutable: solvers return schedules over it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from functools import cached_property
from itertools import chain, repeat
from operator import attrgetter, itemgetter, lt
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
    # the device runtime's own scratch that outlives every op (cuBLAS keeps a workspace per handle and
    # stream once a matmul ran): measured on the device, held for the whole step
    RUNTIME = "runtime"


#: members by value: a plan file's 100k nodes are looked up here (`Enum(value)` costs ten times more);
#: a value that is not here goes through the Enum, which raises the usual ValueError
_PHASES = {p.value: p for p in Phase}
_KINDS = {k.value: k for k in DataKind}

#: Kinds whose bytes are fixed for the whole run: a remat plan cannot touch them.
PERSISTENT_KINDS = frozenset({DataKind.PARAMETER, DataKind.BUFFER, DataKind.INPUT, DataKind.OPTIMIZER_STATE,
                              DataKind.RUNTIME})


#: data kinds no schedule can free or recompute within a step (`Graph.held_bytes`): the persistent ones
#: but inputs, which a schedule may free after their last read, and the parameter gradients a step that
#: accumulates into ``.grad`` holds from its start (`memviz.profile(grads="accumulate")`)
_HELD_KINDS = PERSISTENT_KINDS - {DataKind.INPUT} | {DataKind.PARAMETER_GRADIENT}


@dataclass(frozen=True, slots=True)  # slots: see `frozen_instances`
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


@dataclass(frozen=True, slots=True)
class DataNode:
    id: int
    name: str
    bytes: int
    kind: DataKind
    producer: int | None = None
    shape: tuple[int, ...] = ()
    dtype: str = ""
    aliases: tuple[str, ...] = ()
    #: the data node whose storage this one's producer overwrote in place (eager ``relu_(x)``,
    #: ``hardswish_(x)``: a functionalized capture names the result apart from ``x``): `simulate` counts
    #: one storage for both, held while either is alive, when ``x`` is alive as it is produced
    in_place_of: int | None = None
    #: the data node whose storage this one's producer may overwrite (an op eager runs in place, as
    #: ``relu_(x)``, in a graph that runs it functionally: `memviz.export`): where the schedule frees ``x``
    #: right after that compute (`solvers.simulate.reused_in_place`), the op runs in place and one
    #: storage holds both; elsewhere the result gets its own and ``x`` keeps its values
    reuses: int | None = None


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

    def __post_init__(self) -> None:
        if not self._plainly_well_formed():
            self._check_each_node()
        self._check_acyclic()

    def __hash__(self) -> int:
        # the dataclass hash of the compared fields, computed once: the solvers' per-graph caches
        # (`solvers.memo`) hash the graph on every call, and hashing a 4k-op graph's nodes anew each time
        # took 2 of the default plan's CPU seconds (frozen: the fields never change)
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash((self.computes, self.datas, self.outputs, self.name))

    def __getstate__(self) -> dict[str, Any]:
        # str hashes differ between processes (PYTHONHASHSEED): another process computes its own
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @cached_property
    def shares_storage(self) -> bool:
        """Whether some data node is or may be written in place of another (`DataNode.in_place_of`,
        `DataNode.reuses`); asked by every `simulate` call, so computed once per graph."""
        return (set(map(attrgetter("in_place_of"), self.datas)) > {None}
                or set(map(attrgetter("reuses"), self.datas)) > {None})

    @cached_property
    def _consumers(self) -> tuple[tuple[int, ...], ...]:
        # on first use, not at construction: loading a plan file builds a 100k-node graph that asks none
        consumers: list[list[int]] = [[] for _ in self.datas]
        for c in self.computes:
            for d in dict.fromkeys(c.inputs):
                consumers[d].append(c.id)
        return tuple(map(tuple, consumers))

    def _plainly_well_formed(self) -> bool:
        """The checks of `_check_each_node` in C loops over whole columns (a large plan file is rebuilt
        through here); False sends a graph to `_check_each_node`, which names what is wrong."""
        computes, datas = self.computes, self.datas
        n_data = len(datas)
        producers = list(map(attrgetter("producer"), datas))
        outputs = list(map(attrgetter("outputs"), computes))
        made = list(chain.from_iterable(outputs))
        refs = [*chain.from_iterable(map(attrgetter("inputs"), computes)), *made, *self.outputs]
        if not (
            list(map(attrgetter("id"), computes)) == list(range(len(computes)))
            and list(map(attrgetter("id"), datas)) == list(range(n_data))
            and min(map(attrgetter("bytes"), datas), default=0) >= 0
            and set(map(type, refs)) <= {int}
            and (not refs or 0 <= min(refs) <= max(refs) < n_data)
            and all(set(c.mutates) <= set(c.inputs) for c in computes if c.mutates)
            and all(set(map(attrgetter(f), datas)) <= {None}  # (a C loop: usually none)
                    or all(d.producer is not None and getattr(d, f) in computes[d.producer].inputs
                           for d in datas if getattr(d, f) is not None)
                    for f in ("in_place_of", "reuses"))
        ):
            return False
        # each data node names as producer exactly the compute node that outputs it (ids are positions)
        made_by = dict(zip(made, _owners(outputs), strict=True))
        return (len(made) == n_data - producers.count(None)
                and list(map(made_by.get, range(n_data))) == producers)

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
            for base in (d.in_place_of, d.reuses):
                if base is not None and (d.producer is None or base not in self.computes[d.producer].inputs):
                    raise GraphError(f"data node {d.name!r} is written in place of data id {base}, which its "
                                     "producer does not read")
        for d in self.outputs:
            if not 0 <= d < n_data:
                raise GraphError(f"graph output refers to unknown data id {d}")

    def _check_acyclic(self) -> None:
        # every edge runs from an earlier node to a later one (capture order): no cycle.  In C loops over
        # all edges at once, a source's producer counting as -1 (ids are positions, checked before)
        producer = [-1 if p is None else p for p in map(attrgetter("producer"), self.datas)]
        inputs = list(map(attrgetter("inputs"), self.computes))
        if all(map(lt, map(producer.__getitem__, chain.from_iterable(inputs)), _owners(inputs))):
            return
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

    def held_bytes(self) -> int:
        """Bytes every schedule holds for the whole step, whatever it recomputes or chunks: parameters,
        buffers, optimizer state, the device runtime's scratch and gradients alive from the start (inputs
        are left out: a schedule may free one after its last read)."""
        return sum(d.bytes for d in self.datas if d.producer is None and d.kind in _HELD_KINDS)

    @cached_property
    def required_computes(self) -> frozenset[int]:
        """Compute nodes that some required output depends on, and those producing nothing (all of them,
        for captured graphs).  A compute without outputs is there for its effect alone -- the optimizer
        updates parameters and state in place -- so it must run: a schedule without it would plan a step
        whose optimizer memory nobody counted while the user's optimizer still runs."""
        producer = list(map(attrgetter("producer"), self.datas))
        inputs = list(map(attrgetter("inputs"), self.computes))
        need: set[int] = set()
        stack = list(map(producer.__getitem__, self.outputs))
        stack += [c.id for c in self.computes if not c.outputs]
        while stack:
            c = stack.pop()
            if c is None or c in need:
                continue
            need.add(c)
            stack.extend(map(producer.__getitem__, inputs[c]))  # (C loop: a 100k-node graph comes through)
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
                    # only where there is one: older plan files have none
                    **({"in_place_of": d.in_place_of} if d.in_place_of is not None else {}),
                    **({"reuses": d.reuses} if d.reuses is not None else {}),
                }
                for d in self.datas
            ],
            "outputs": list(self.outputs),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any], *,
                  columns: Mapping[str, Mapping[str, Sequence[Any]]] | None = None) -> Graph:
        """The graph of `obj` (`to_dict`'s form).  `columns` may hold its "computes" or "datas" already
        read field by field (field name -> values, node by node, as in `obj`; an optional field without a
        column takes its default for every node): those items are not read again."""
        columns = columns or {}
        # column by column (`map` over the node class): a plan file's graph has 100k nodes
        c = _with_defaults(columns.get("computes") or node_columns(obj["computes"], ComputeNode), ComputeNode)
        computes = frozen_instances(
            ComputeNode, c["id"], c["name"], c["op"], _members(_PHASES, Phase, c["phase"]),
            map(tuple, c["inputs"]), map(tuple, c["outputs"]), map(float, c["time"]),
            map(int, c["temp_bytes"]), c["module"], c["source"], c["block"], map(float, c["flops"]),
            map(tuple, c["mutates"]),
        )
        d = _with_defaults(columns.get("datas") or node_columns(obj["datas"], DataNode), DataNode)
        datas = frozen_instances(
            DataNode, d["id"], d["name"], map(int, d["bytes"]), _members(_KINDS, DataKind, d["kind"]),
            d["producer"], map(tuple, d["shape"]), d["dtype"], map(tuple, d["aliases"]), d["in_place_of"],
            d["reuses"],
        )
        return cls(
            computes,
            datas,
            tuple(obj["outputs"]),
            name=obj.get("name", "graph"),
            meta=dict(obj.get("meta", {})),
        )


#: the node fields a graph dict may leave out (`Graph.from_dict`), with the value they then take
_OPTIONAL: dict[type, dict[str, Any]] = {
    ComputeNode: {"module": "", "source": "", "block": None, "flops": 0.0, "mutates": ()},
    DataNode: {"producer": None, "shape": (), "dtype": "", "aliases": (), "in_place_of": None,
               "reuses": None},
}


#: optional node fields `Graph.to_dict` leaves out where they hold their default
_SPARSE = frozenset({"mutates", "in_place_of", "reuses"})


def node_columns(items: list[dict[str, Any]], node: type) -> dict[str, Sequence[Any]]:
    """The values of each field of the node dataclass `node` in `items` (dicts as `Graph.to_dict` writes
    them), field by field; an item without an optional field takes its default, one without another
    field is a KeyError.  One transposing pass when every item has every field (a third faster than a
    pass per field over 100k dicts), else a pass per field."""
    optional = _OPTIONAL[node]
    # fields `to_dict` writes only where they are set (`mutates`) are read apart, so the transposing
    # pass still serves the graphs that never set them
    sparse = [f.name for f in fields(node) if f.name in _SPARSE]
    names = [f.name for f in fields(node) if f.name not in _SPARSE]
    try:
        dense = dict(zip(names, list(zip(*map(itemgetter(*names), items), strict=True)) or [()] * len(names),
                         strict=True))
        return {**dense, **{k: list(map(dict.get, items, repeat(k), repeat(optional[k]))) for k in sparse}}
    except KeyError:
        names += sparse
        return {k: list(map(dict.get, items, repeat(k), repeat(optional[k]))) if k in optional
                else list(map(itemgetter(k), items)) for k in names}


def _with_defaults(columns: Mapping[str, Sequence[Any]], node: type) -> dict[str, Iterable[Any]]:
    """`columns` with each missing optional field filled with its default (a KeyError names a missing
    field that is not optional)."""
    n = len(columns["id"])
    optional = _OPTIONAL[node]
    return {f.name: repeat(optional[f.name], n) if f.name not in columns and f.name in optional
            else columns[f.name] for f in fields(node)}


def _owners(lists: Sequence[Sequence[int]]) -> Iterable[int]:
    """The position of the list each item of `lists` comes from, item by item (0, 0, 1, 3, ... for
    lists of lengths 2, 1, 0, ...), matching `chain.from_iterable(lists)`."""
    return chain.from_iterable(map(repeat, range(len(lists)), map(len, lists)))


def _members(by_value: dict[str, Any], enum: type[Enum], values: Iterable[Any]) -> list[Any]:
    """The enum members of `values`, looked up in one C loop; a value that is not a member goes through
    the Enum, which raises its usual ValueError."""
    values = list(values)
    try:
        return list(map(by_value.__getitem__, values))
    except (KeyError, TypeError):
        return list(map(enum, values))


def frozen_instances(cls: type, *columns: Iterable[Any]) -> tuple[Any, ...]:
    """Instances of the frozen, slotted dataclass `cls` (fields in order, no __post_init__) from columns
    of field values, all in C loops: the instances allocated at once, then each field's slot filled
    through its descriptor, column by column.  Its generated __init__ (a Python call per instance, and
    one object.__setattr__ per field) was half the cost of rebuilding a plan file's 100k nodes."""
    made: list[Any] | None = None
    for f, column in zip(fields(cls), columns, strict=True):
        values = list(column)
        if made is None:
            made = list(map(object.__new__, repeat(cls, len(values))))
        if len(values) != len(made):
            raise ValueError(f"{cls.__name__} columns of different lengths")
        deque(map(getattr(cls, f.name).__set__, made, values), maxlen=0)
    return tuple(made or ())


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
