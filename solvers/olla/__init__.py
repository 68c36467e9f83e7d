"""OLLA (Steiner et al. 2022): operator reordering and tensor address packing, exact with CP-SAT.

`reorder(graph)` finds a peak-minimising operator order; `pack(buffers)` places tensors at integer
addresses without fragmentation; `pack_schedule(graph, schedule)` packs any plan's tensors.
"""

from solvers.olla.pack import Packing, PackingError, max_live, pack, pack_schedule, validate_packing
from solvers.olla.reorder import executor_tail, free_updated_gradients, lower_bound, order_peak, reorder

__all__ = [
    "Packing", "PackingError", "executor_tail", "free_updated_gradients", "lower_bound", "max_live",
    "order_peak", "pack", "pack_schedule", "reorder", "validate_packing",
]
