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


def turn_issue(schedule: Sequence[Step], first: int, then: int) -> str | None:
    """Why `schedule` is not one an executor that runs `first` exactly once, right before `then` (only
    frees between them), can run; None when it is (or when it never runs `then`)."""
    runs = [i for i, s in enumerate(schedule) if s.op == "compute" and s.node == first]
    turn = next((i for i, s in enumerate(schedule) if s.op == "compute" and s.node == then), None)
    if turn is None:
        return None
    if len(runs) != 1 or runs[0] > turn:
        before = sum(i < turn for i in runs)
        return f"it computes node {first} {len(runs)} times ({before} before node {then})"
    between = [s.node for s in schedule[runs[0] + 1 : turn] if s.op == "compute"]
    if between:
        return f"it computes node(s) {between[:5]} between node {first} and node {then}"
    return None


def run_turn_once(graph: Graph, schedule: Schedule, first: int, then: int) -> Schedule:
    """`schedule` as an executor runs it that computes `first` once, right before `then`, with only frees
    between (memviz.export: the user's loss runs once, after the exported forward has returned, and its
    backward is the next thing that happens).  A remat solver treats the two as ordinary nodes: Rockmate
    puts the loss in the last block of its chain and ran that block's forward in the forward sweep and
    again before its backward (Mistral, Llama); Rotor's chain and Checkmate's stage of `then` (which
    recomputes what later stages keep before `then` itself) allow the like.  The executor would run
    those in-between computes before the loss, with its inputs (the model's outputs) still alive, and
    the first loss only: a peak the simulation of `schedule` does not show.  So:
    - every computation of `first` but the last one before `then` goes, with the frees of its outputs
      before that one (nothing but `then` reads them);
    - the computes between that one and `then`, and the frees of what `first` does not read, move
      before it, where the executor runs them;
    - a recomputation there of what `first` reads (a model output the loss takes whole, HF's
      ``past_key_values`` with each layer's keys and values: the solver's last block then spans every
      layer and recomputes them before the loss's backward) goes with the frees of those values after
      `first`: they stay alive from their first computation on (ValueError where such a compute also
      makes values `first` does not read);
    - computes left dead by that (each output freed before anything reads it) go, with those frees.
    The result is what runs: its simulation is the executor's memory.  Unchanged when already so."""
    if turn_issue(schedule, first, then) is None:
        return schedule
    steps = list(schedule)
    turn = next(i for i, s in enumerate(steps) if s.op == "compute" and s.node == then)
    runs = [i for i in range(turn) if steps[i].op == "compute" and steps[i].node == first]
    if not runs:
        raise ValueError(f"node {then} runs before node {first}: no executor can run its loss once before it")
    last = runs[-1]
    made, reads = set(graph.computes[first].outputs), set(graph.computes[first].inputs)
    dropped = set(runs[:-1])
    head = [s for i, s in enumerate(steps[:last])
            if i not in dropped and not (s.op == "free" and s.node in made)]
    between = steps[last + 1 : turn]
    rebuilt = [s for s in between if s.op == "compute" and reads.intersection(graph.computes[s.node].outputs)]
    if any(not reads.issuperset(graph.computes[s.node].outputs) for s in rebuilt):
        raise ValueError(f"the schedule recomputes an input of node {first} between it and node {then}, "
                         "with values the node does not read")
    # the frees before a value's last rebuild go; one after it (the value read and freed in between)
    # stays after `first`
    rebuilt_at = {d: i for i, s in enumerate(between) if s in rebuilt for d in graph.computes[s.node].outputs}
    moved = [s for s in between if not (s.op == "free" and s.node in reads) and s not in rebuilt]
    stay = [s for i, s in enumerate(between)
            if s.op == "free" and s.node in reads and i > rebuilt_at.get(s.node, -1)]
    # later computations of `first` (after `then`) are no-ops for the executor too, and so are the
    # frees of what they would have made again
    tail, alive = [], set(made)
    for s in steps[turn:]:
        if s.op == "compute" and s.node == first:
            continue
        if s.op == "free" and s.node in made:
            if s.node not in alive:
                continue
            alive.discard(s.node)
        tail.append(s)
    return _without_dead(graph, [*head, *moved, steps[last], *stay, *tail])


def _without_dead(graph: Graph, steps: list[Step]) -> Schedule:
    """`steps` without the computes whose every output is freed before anything reads it (and without
    those frees); a compute with no outputs (an update) or a required output stays.  One backward pass:
    a compute only a dead one read is dead in turn."""
    required = set(graph.outputs)
    nxt: dict[int, tuple[str, int]] = {}  # data -> the next event after the current position
    gone: set[int] = set()
    for p in range(len(steps) - 1, -1, -1):
        s = steps[p]
        if s.op == "free":
            nxt[s.node] = ("free", p)
            continue
        c = graph.computes[s.node]
        if c.outputs and all(d not in required and nxt.get(d, ("", 0))[0] == "free" for d in c.outputs):
            gone.add(p)
            gone.update(nxt[d][1] for d in c.outputs)
            for d in c.outputs:
                nxt[d] = ("produce", p)
            continue
        for d in c.outputs:
            nxt[d] = ("produce", p)
        for d in c.inputs:
            nxt[d] = ("read", p)
    return tuple(s for p, s in enumerate(steps) if p not in gone)
