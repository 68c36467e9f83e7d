"""Print a small `memviz.plan/1` document built with `solvers` (graph, eager baseline, a plan with one
recomputation) for the extension's tests.  Names carry HTML on purpose: the views must escape them."""

from __future__ import annotations

import json
import sys

from solvers import GraphBuilder, compute, eager_schedule, free, simulate
from solvers.allocator import simulate_caching_allocator
from solvers.olla import pack_schedule

MiB = 2**20
HOSTILE = "<img src=x onerror=alert(1)>"


def sample_plan() -> dict[str, object]:
    b = GraphBuilder("tiny-mlp")
    w = b.data("w", 4 * MiB, "parameter")
    x = b.data("x", 1 * MiB, "input")
    a1, a2, a3 = (b.data(f"a{i}", 8 * MiB, "saved") for i in (1, 2, 3))
    loss = b.data("loss", 4, "output")
    g3, g2, g1 = (b.data(f"g{i}", 8 * MiB, "gradient") for i in (3, 2, 1))
    gw = b.data("w.grad", 4 * MiB, "parameter_gradient")
    b.compute("linear", [x, w], [a1], op="aten.mm", module="net.fc1", source="model.py:10", time=1.0)
    b.compute("relu", [a1], [a2], op="aten.relu", module=HOSTILE, source="model.py:11", time=1.0,
              temp_bytes=2 * MiB)
    b.compute("tanh", [a2], [a3], op="aten.tanh", module="net.act", source="model.py:12", time=1.0)
    b.compute("sum", [a3], [loss], op="aten.sum", module="", source="train.py:5", time=1.0)
    b.compute("tanh_backward", [loss, a3], [g3], op="aten.tanh_backward", phase="backward", time=1.0)
    b.compute("relu_backward", [g3, a2], [g2], op="aten.threshold_backward", phase="backward", time=1.0)
    b.compute(HOSTILE, [g2, a1], [g1], op="aten.mul", phase="backward", module="net.fc1", time=1.0)
    b.compute("mm_backward", [g1, x], [gw], op="aten.mm", phase="backward", module="net.fc1", time=1.0)
    b.outputs = [loss, gw]
    graph = b.build()
    baseline = eager_schedule(graph)
    # Free a1 once a2 exists and recompute it for the backward pass: one recomputation, lower peak.
    planned = (compute(0), compute(1), free(a1), compute(2), compute(3), compute(4), free(a3),
               compute(5), free(g3), free(a2), compute(0), compute(6), free(g2), free(a1), compute(7),
               free(g1))
    base_tl, plan_tl = simulate(graph, baseline).check(), simulate(graph, planned).check()
    return {
        "schema": "memviz.plan/1",
        "memviz_version": "0.1.0",
        "created": "2026-11-22T00:00:00+00:00",
        "model": {"name": f"tiny {HOSTILE}", "mode": "train", "fingerprint": "test"},
        "device": {"name": "cpu", "estimated": False, "capacity_bytes": None},
        "strategy": "checkmate",
        "budget_bytes": 32 * MiB,
        "graph": graph.to_dict(),
        "baseline": {"schedule": [s.to_json() for s in baseline], "timeline": base_tl.to_dict()},
        "planned": {"schedule": [s.to_json() for s in planned], "timeline": plan_tl.to_dict()},
        "solver_stats": {"solver": "hand", "status": "heuristic", "seconds": 0.0, "objective": None,
                         "bound": None, "gap": None, "backend": "", "extra": {}},
        # The planned address packing and PyTorch's caching allocator on the planned schedule.
        "packing": {**pack_schedule(graph, planned, time_limit=5.0).to_dict(),
                    "allocator": simulate_caching_allocator(graph, planned).to_dict()},
        "chunks": [],
        "frontier": [],
    }


if __name__ == "__main__":
    json.dump(sample_plan(), sys.stdout)
