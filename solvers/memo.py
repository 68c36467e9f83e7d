"""What a solver remembers per graph across calls: the values of the most recently used keys.

Time-limited solvers find different things from call to call; remembering per graph what one call found
(Rockmate's block menus, Checkmate's lowest-peak schedule, the best operator order) keeps later calls on
the same graph consistent with it.  Bounded, so a long session does not hold every graph it planned.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RecentMemo(Generic[K, V]):
    """A mapping that keeps the `size` most recently stored keys."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        """Store `value` as the most recent; the least recent key goes once there are too many."""
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
