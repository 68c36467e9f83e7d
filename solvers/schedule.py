"""Schedules: sequences of `compute(c)` and `free(d)` steps over a CD-graph.

Recomputation is simply a second `compute` of the same node.  `eager_schedule` reproduces what
PyTorch's eager mode does for a given operator order: every tensor produced during the run is freed
right after its last reader, sources (parameters, buffers, inputs) stay alive.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Literal

from solvers.ir import Graph, frozen_instances


@dataclass(frozen=True, slots=True)  # no instance dict: a plan file holds 100k steps per run
class Step:
    op: Literal["compute", "free"]
    node: int

    def to_json(self) -> list[object]:
        return [self.op, self.node]


def compute(c: int) -> Step:
    return Step("compute", c)


def free(d: int) -> Step:
    return Step("free", d)


Schedule = tuple[Step, ...]


def steps_from_json(obj: Iterable[Sequence[object]]) -> Schedule:
    items = list(obj)
    try:  # the whole schedule in C loops (a plan file holds 100k steps); any doubt: step by step, below
        if set(map(type, items)) <= {list, tuple} and set(map(len, items)) <= {2}:
            steps = _plain_steps(list(map(itemgetter(0), items)), list(map(itemgetter(1), items)))
            if steps is not None:
                return steps
    except (TypeError, KeyError, IndexError):
        pass
    steps = []
    for item in items:
        op, node = item
        if op not in ("compute", "free") or not isinstance(node, int) or isinstance(node, bool):
            raise ValueError(f"bad schedule step {item!r}: expected ['compute'|'free', int]")
        steps.append(Step(op, node))  # type: ignore[arg-type]
    return tuple(steps)


def steps_from_columns(ops: Sequence[object], nodes: Sequence[object]) -> Schedule:
    """`steps_from_json` of the steps [ops[i], nodes[i]], from those two columns (the schedule as a plan
    file's validation already read it)."""
    try:
        steps = _plain_steps(ops, nodes) if len(ops) == len(nodes) else None
    except TypeError:  # an unhashable op
        steps = None
    return steps if steps is not None else steps_from_json(list(map(list, zip(ops, nodes, strict=True))))


def _plain_steps(ops: Sequence[object], nodes: Sequence[object]) -> Schedule | None:
    """The steps, in C loops, when every op is "compute" or "free" and every node an int (not a bool);
    None when one is not."""
    if set(ops) <= {"compute", "free"} and set(map(type, nodes)) <= {int}:
        return frozen_instances(Step, ops, nodes)
    return None


def eager_schedule(graph: Graph, order: Sequence[int] | None = None) -> Schedule:
    """Compute every node once in `order` (default: capture order), freeing tensors after last use."""
    order = list(range(len(graph.computes))) if order is None else list(order)
    if not graph.is_topological(order):
        raise ValueError("order is not a topological order of every compute node")
    pos = {c: i for i, c in enumerate(order)}
    keep = set(graph.outputs)
    last_use: dict[int, int] = {}
    for d in graph.datas:
        if d.producer is None or d.id in keep:
            continue
        readers = graph.consumers(d.id)
        last_use[d.id] = max((pos[r] for r in readers), default=pos[d.producer])
    frees_after: dict[int, list[int]] = {}
    for d, p in last_use.items():
        frees_after.setdefault(p, []).append(d)
    steps: list[Step] = []
    for i, c in enumerate(order):
        steps.append(compute(c))
        steps.extend(free(d) for d in sorted(frees_after.get(i, ())))
    return tuple(steps)


def keep_outputs_alive(graph: Graph, schedule: Schedule) -> Schedule:
    """The schedule without frees of the graph's outputs, and without the recomputations that only
    rebuilt them.  The simulator accepts freeing a model output and recomputing it before the end, but
    the exported module hands the forward outputs to the caller when the backward starts, so they
    must stay alive once computed (Checkmate's LP rounding, for one, frees them)."""
    outputs = set(graph.outputs)
    alive = [d.producer is None for d in graph.datas]
    pinned: set[int] = set()  # outputs whose free was dropped
    kept = []
    for step in schedule:
        if step.op == "free":
            if step.node in outputs:
                pinned.add(step.node)
                continue
            alive[step.node] = False
        else:
            produced = graph.computes[step.node].outputs
            if produced and all(alive[d] for d in produced) and pinned.intersection(produced):
                continue  # it only rebuilt outputs that were kept alive above
            for d in produced:
                alive[d] = True
        kept.append(step)
    return schedule if len(kept) == len(schedule) else tuple(kept)


def compute_order(schedule: Iterable[Step]) -> list[int]:
    return [s.node for s in schedule if s.op == "compute"]
