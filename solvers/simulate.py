"""The independent simulator: the single source of truth for memory over time, peak, time and validity.

Every solver's schedule passes through `simulate` before memviz returns it.  Memory model (the one
Checkmate and Rockmate use, Rockmate Appendix B.2): while compute node `c` runs, the live set, the
outputs of `c` not already alive and `c`'s transient workspace are all resident; afterwards the
outputs stay until an explicit `free`.

A node that writes an input in place (`ComputeNode.mutates`: a gradient accumulated into its first
contribution's buffer) allocates nothing for that input.  Its effect must happen exactly once: the
schedule may not run it again (the sum would be added twice), nor produce the written data node again
after it (the recomputed value would lack the sum).

A data node written in place of another (`DataNode.in_place_of`: eager ``relu_(x)``) shares the storage
of that input when the input is alive as it is produced: nothing is allocated, the storage is held while
either is alive, and reading the input afterwards is an error (its values were overwritten).  An input
already freed (a recomputation that re-runs only the in-place op's consumers) gives a fresh storage.

A data node that may reuse another's storage (`DataNode.reuses`: an op eager runs in place, in a graph
run functionally) shares it only where the schedule frees that input right after the op
(`reused_in_place`): the executor then runs the op in place, as eager does; elsewhere the result gets a
storage of its own and the input keeps its values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice, repeat
from operator import add, attrgetter, is_

from solvers.ir import ComputeNode, DataKind, DataNode, Graph
from solvers.schedule import Step

#: Breakdown categories shown by every view, in stacking order.
CATEGORIES = (
    "parameters",
    "buffers",
    "inputs",
    "optimizer_state",
    "parameter_gradients",
    "gradients",
    "activations",
    "outputs",
    "communication",
    "runtime",  # the device runtime's persistent scratch (cuBLAS workspaces)
    "workspace",  # an op's transient scratch, during that op only (`ComputeNode.temp_bytes`)
)

_CATEGORY_OF = {
    DataKind.PARAMETER: "parameters",
    DataKind.BUFFER: "buffers",
    DataKind.INPUT: "inputs",
    DataKind.OPTIMIZER_STATE: "optimizer_state",
    DataKind.PARAMETER_GRADIENT: "parameter_gradients",
    DataKind.GRADIENT: "gradients",
    DataKind.ACTIVATION: "activations",
    DataKind.SAVED: "activations",
    DataKind.OUTPUT: "outputs",
    DataKind.COMMUNICATION: "communication",
    DataKind.RUNTIME: "runtime",
}


def category(kind: DataKind) -> str:
    return _CATEGORY_OF[kind]


@dataclass(frozen=True)
class ScheduleIssue:
    step: int  # -1: at the end of the schedule
    node: int
    message: str

    def __str__(self) -> str:
        where = "at the end" if self.step < 0 else f"step {self.step}"
        return f"{where}: {self.message}"


class InvalidSchedule(ValueError):
    def __init__(self, issues: Iterable[ScheduleIssue]) -> None:
        self.issues = tuple(issues)
        shown = "; ".join(map(str, self.issues[:5]))
        more = f" (and {len(self.issues) - 5} more)" if len(self.issues) > 5 else ""
        super().__init__(f"invalid schedule: {shown}{more}")


@dataclass(frozen=True)
class Timeline:
    """Memory after/while each step runs.  `step_bytes[i]` is resident memory during step i (for a
    free: after it); `by_category[k][i]` splits it; `live_bytes[i]` is what stays after step i."""

    steps: tuple[Step, ...]
    step_bytes: tuple[int, ...]
    live_bytes: tuple[int, ...]
    by_category: dict[str, tuple[int, ...]]
    initial_bytes: int
    peak_bytes: int
    peak_step: int
    total_time: float
    computes: int
    recomputes: int
    issues: tuple[ScheduleIssue, ...] = field(default=())

    @property
    def valid(self) -> bool:
        return not self.issues

    def check(self) -> Timeline:
        if self.issues:
            raise InvalidSchedule(self.issues)
        return self

    def to_dict(self) -> dict[str, object]:
        return {
            "step_bytes": list(self.step_bytes),
            "live_bytes": list(self.live_bytes),
            "by_category": {k: list(v) for k, v in self.by_category.items()},
            "initial_bytes": self.initial_bytes,
            "peak_bytes": self.peak_bytes,
            "peak_step": self.peak_step,
            "total_time": self.total_time,
            "computes": self.computes,
            "recomputes": self.recomputes,
            "valid": self.valid,
            "issues": [{"step": i.step, "node": i.node, "message": i.message} for i in self.issues],
        }


def simulate(graph: Graph, schedule: Iterable[Step]) -> Timeline:
    """Replay `schedule` on `graph`; never raises on a bad schedule, reports issues instead.

    The replay loop records only what each step changes (the bytes its outputs or its free add to one
    category, its workspace); the per-category series, the live bytes and the step bytes are then
    running sums of those changes (`itertools.accumulate`, in C), so a step costs a few operations
    instead of two passes over every category."""
    steps = tuple(schedule)
    datas, computes = graph.datas, graph.computes
    n = len(steps)
    column = {k: i for i, k in enumerate(CATEGORIES)}
    # per data node, in C loops (a plan file's graph has 100k): category column, size, alive at start
    cat_of = list(map({kind: column[category(kind)] for kind in _CATEGORY_OF}.__getitem__,
                      map(attrgetter("kind"), datas)))
    size = list(map(attrgetter("bytes"), datas))
    alive = list(map(is_, map(attrgetter("producer"), datas), repeat(None)))
    freed_at: dict[int, int] = {}
    initial_by_cat = [0] * len(CATEGORIES)
    for d in compress(range(len(datas)), alive):
        initial_by_cat[cat_of[d]] += size[d]
    initial = sum(initial_by_cat)
    issues: list[ScheduleIssue] = []
    # change of each category's resident bytes at each step (workspace: the step's own, not carried on)
    changes = [[0] * n for _ in CATEGORIES]
    workspace = changes[column["workspace"]]
    change = [0] * n  # of the live total
    done = [False] * len(computes)
    written: dict[int, str] = {}  # data node -> the node that wrote it in place (`ComputeNode.mutates`)
    writes = any(c.mutates for c in computes)  # (a local test per step: plan files have 100k of them)
    # (None when no node is written in place of another: the usual graph keeps the plain loop below)
    shared = _Storages(datas) if graph.shares_storage else None
    reused = reused_in_place(graph, steps) if shared is not None else {}
    total_time = 0.0
    n_run = 0  # compute steps of known nodes, recomputations included

    n_computes, n_datas = len(computes), len(datas)
    is_alive = alive.__getitem__
    for i, step in enumerate(steps):
        op, node = step.op, step.node
        if op == "compute":
            if not 0 <= node < n_computes:
                issues.append(ScheduleIssue(i, node, f"unknown compute node id {node}"))
                continue
            c = computes[node]
            if not all(map(is_alive, c.inputs)):  # (one C loop for the usual, valid step)
                for d in c.inputs:
                    if not alive[d]:
                        why = f"freed at step {freed_at[d]}" if d in freed_at else "never computed"
                        issues.append(
                            ScheduleIssue(
                                i,
                                c.id,
                                f"compute {c.name!r} reads {datas[d].name!r}, which is not alive ({why})",
                            )
                        )
            if writes and (c.mutates or written):
                issues.extend(_in_place_issues(i, c, done[node], written, datas))
            if shared is not None:
                issues.extend(shared.read_issues(i, c, datas))
            reused_at = reused.get(i, {}) if reused else {}
            n_run += 1
            done[node] = True
            total_time += c.time
            # (`freed_at` keeps a recomputed output's last free: only a free makes it dead again, and
            # that free overwrites the entry)
            for d in c.outputs:
                if not alive[d]:
                    alive[d] = True
                    if shared is not None and not shared.allocates(d, alive, c.name, reused_at.get(d)):
                        continue
                    changes[cat_of[d]][i] += size[d]
                    change[i] += size[d]
            workspace[i] = c.temp_bytes
        elif op == "free":
            if not 0 <= node < n_datas:
                issues.append(ScheduleIssue(i, node, f"unknown data node id {node}"))
            elif not alive[node]:
                issues.append(ScheduleIssue(i, node, f"free of {datas[node].name!r}, which is not alive"))
            else:
                alive[node] = False
                freed_at[node] = i
                owner = node if shared is None else shared.release(node)
                if owner is not None:
                    changes[cat_of[owner]][i] -= size[owner]
                    change[i] -= size[owner]
        else:
            issues.append(ScheduleIssue(i, node, f"unknown step kind {op!r}"))

    # memory during step i: what was resident before it plus its changes (a free's: after it), plus its
    # workspace, which is gone after the step
    series = {
        k: tuple(workspace) if k == "workspace" else _running(changes[column[k]], initial_by_cat[column[k]])
        for k in CATEGORIES
    }
    live_bytes = _running(change, initial)
    step_bytes = tuple(map(add, live_bytes, workspace))

    if not all(map(alive.__getitem__, graph.outputs)):  # (one C loop when all are, as in a valid plan)
        for d in graph.outputs:
            if not alive[d]:
                issues.append(ScheduleIssue(-1, d, f"required output {datas[d].name!r} is not alive"))
    n_compute = done.count(True)  # nodes run at least once; their other runs are recomputations
    required = graph.required_computes
    missing = [] if all(map(done.__getitem__, required)) else [
        computes[c].name for c in sorted(required) if not done[c]]
    if missing:
        issues.append(ScheduleIssue(-1, -1, f"compute nodes never run: {', '.join(missing[:5])}"))
    peak_step = step_bytes.index(max(step_bytes)) if step_bytes else -1  # the first step at the peak
    peak = max(initial, step_bytes[peak_step]) if step_bytes else initial
    return Timeline(
        steps=steps,
        step_bytes=step_bytes,
        live_bytes=live_bytes,
        by_category=series,
        initial_bytes=initial,
        peak_bytes=peak,
        peak_step=peak_step if step_bytes and step_bytes[peak_step] >= initial else -1,
        total_time=total_time,
        computes=n_compute,
        recomputes=n_run - n_compute,
        issues=tuple(issues),
    )


def _in_place_issues(i: int, c: ComputeNode, ran: bool, written: dict[int, str],
                     datas: tuple[DataNode, ...]) -> list[ScheduleIssue]:
    """What is wrong with running `c` at step `i` given the in-place writes so far (`written`, which
    records `c`'s own writes)."""
    issues = [ScheduleIssue(i, c.id, f"compute {c.name!r} produces {datas[d].name!r} again after "
                                     f"{written[d]!r} wrote it in place: the write would be lost")
              for d in c.outputs if d in written]
    if c.mutates and ran:
        issues.append(ScheduleIssue(i, c.id, f"compute {c.name!r} writes its input in place and runs again: "
                                             "its update would be applied twice"))
    written.update(dict.fromkeys(c.mutates, c.name))
    return issues


class _Storages:
    """Which storage each live data node is held in, where some nodes are written in place of others
    (`DataNode.in_place_of`): a storage is counted once, as the node that allocated it, and released with
    the last live node in it."""

    def __init__(self, datas: tuple[DataNode, ...]) -> None:
        self.base = list(map(attrgetter("in_place_of"), datas))
        self.storage: dict[int, int] = {}  # live data node -> its storage (an allocation serial)
        self.allocated: dict[int, int] = {}  # storage -> the data node that allocated it
        self.holders: dict[int, int] = {}  # storage -> live data nodes in it
        self.overwritten: dict[int, str] = {}  # live data node -> the node written over it in place

    def _storage_of(self, d: int) -> int:
        """`d`'s storage; a source (alive from the start, never produced here) gets one on first use."""
        if d not in self.storage:
            self.storage[d] = s = len(self.allocated)
            self.allocated[s] = d
            self.holders[s] = 1
        return self.storage[d]

    def allocates(self, d: int, alive: list[bool], writer: str, reused: int | None = None) -> bool:
        """`d` becomes alive: whether that allocates a storage (else it joins its live base's: the node
        it is written in place of, or the one it `reused`)."""
        base = self.base[d] if self.base[d] is not None else reused
        if base is None or not alive[base]:
            self.storage.pop(d, None)
            self._storage_of(d)
            return True
        s = self.storage[d] = self._storage_of(base)
        self.holders[s] += 1
        self.overwritten[base] = writer
        return False

    def release(self, d: int) -> int | None:
        """`d` is freed: the data node whose allocation goes with it, or None while another holds it."""
        s = self._storage_of(d)
        del self.storage[d]
        self.overwritten.pop(d, None)
        self.holders[s] -= 1
        return None if self.holders[s] else self.allocated[s]

    def read_issues(self, i: int, c: ComputeNode, datas: tuple[DataNode, ...]) -> list[ScheduleIssue]:
        """`c` reading a value an in-place write has overwritten (the live input of a written node)."""
        return [ScheduleIssue(i, c.id, f"compute {c.name!r} reads {datas[d].name!r} after "
                                       f"{self.overwritten[d]!r} overwrote its storage in place")
                for d in c.inputs if d in self.overwritten]


def reused_in_place(graph: Graph, steps: Sequence[Step]) -> dict[int, dict[int, int]]:
    """Compute step index -> {output: the input whose storage it takes over}: the outputs that may reuse
    an input's storage (`DataNode.reuses`) where the schedule frees that input among the frees right
    after the step, before the next compute.  Nothing reads the input after the op then, so running the
    op in place changes no value; `memviz.export`'s generated code does exactly there."""
    may = {d.id: d.reuses for d in graph.datas if d.reuses is not None}
    if not may:
        return {}
    computes, found = graph.computes, {}
    for i, step in enumerate(steps):
        if step.op != "compute" or not 0 <= step.node < len(computes):
            continue
        outs = [(d, may[d]) for d in computes[step.node].outputs if d in may]
        if not outs:
            continue
        freed = set()
        for later in islice(steps, i + 1, None):
            if later.op != "free":
                break
            freed.add(later.node)
        pairs = {d: x for d, x in outs if x in freed}
        if pairs:
            found[i] = pairs
    return found


def _running(changes: list[int], start: int) -> tuple[int, ...]:
    """The running sums start + changes[0], start + changes[0] + changes[1], ..."""
    if not any(changes):  # a category no step changes (parameters, buffers in training): a C loop to see
        return (start,) * len(changes)
    return tuple(islice(accumulate(changes, initial=start), 1, None))
