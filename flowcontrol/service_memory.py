"""How much service each tenant received lately, for fairness across worker processes.

One worker's fairness policy remembers only its own dispatches. With several workers the
tenants are compared by what the whole proxy served them, and that needs a figure each
worker can publish and the others can add up: here an exponentially decaying sum. Every
amount added loses weight as exp(-age / memory), so service older than a few `memory`
seconds no longer counts, and a tenant that was idle comes back level with one that was not
within that time. Pure: the clock is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# Kept keys; when exceeded, those whose service has decayed below `FORGOTTEN` go first.
MAX_KEYS = 10_000
FORGOTTEN = 1e-3


class ServiceMemory(Generic[K]):
    """Decaying service per key: `add` what a key was served at `now`, `value` what it
    amounts to at a later `now`."""

    def __init__(self, memory: float, max_keys: int = MAX_KEYS) -> None:
        if not memory > 0:
            raise ValueError(f"memory must be positive, not {memory}")
        self._memory = memory
        self._max = max_keys
        self._kept: dict[K, tuple[float, float]] = {}  # key -> (value, as of when)

    def __len__(self) -> int:
        return len(self._kept)

    def add(self, key: K, amount: float, now: float) -> None:
        self._kept[key] = (self.value(key, now) + amount, now)
        if len(self._kept) > self._max:
            self._forget(now)

    def value(self, key: K, now: float) -> float:
        kept = self._kept.get(key)
        if kept is None:
            return 0.0
        value, at = kept
        return value * math.exp(-max(now - at, 0.0) / self._memory)

    def items(self, now: float) -> Iterator[tuple[K, float]]:
        """Every key with what its service amounts to at `now`."""
        for key in list(self._kept):
            yield key, self.value(key, now)

    def _forget(self, now: float) -> None:
        kept = self._kept
        for key in [k for k, v in self.items(now) if v < FORGOTTEN]:
            del kept[key]
        while len(kept) > self._max:  # all still weigh: the least recently served go
            del kept[min(kept, key=lambda k: kept[k][1])]
