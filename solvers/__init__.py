"""Torch-free memory planning over one CD-graph IR (never imports torch or memviz)."""

from solvers.ir import (
    ComputeNode,
    DataKind,
    DataNode,
    Graph,
    GraphBuilder,
    GraphError,
    Phase,
    with_order_chain,
)
from solvers.schedule import Schedule, Step, compute, eager_schedule, free
from solvers.simulate import CATEGORIES, InvalidSchedule, ScheduleIssue, Timeline, simulate

__all__ = [
    "CATEGORIES", "ComputeNode", "DataKind", "DataNode", "Graph", "GraphBuilder", "GraphError",
    "InvalidSchedule", "Phase", "Schedule", "ScheduleIssue", "Step", "Timeline", "compute",
    "eager_schedule", "free", "simulate", "with_order_chain",
]
