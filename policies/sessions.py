"""A bounded key -> backend table with least-recently-used eviction (sessions, programs)."""

from __future__ import annotations

from collections import OrderedDict


class AffinityTable:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._owners: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        return self._owners.get(key)

    def set(self, key: str, backend_id: str) -> None:
        self._owners[key] = backend_id
        self._owners.move_to_end(key)
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def pop(self, key: str) -> str | None:
        return self._owners.pop(key, None)

    def forget_backend(self, backend_id: str) -> int:
        stale = [k for k, v in self._owners.items() if v == backend_id]
        for k in stale:
            del self._owners[k]
        return len(stale)

    def __len__(self) -> int:
        return len(self._owners)
