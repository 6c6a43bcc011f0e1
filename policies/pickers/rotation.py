"""A rotating start index: the deterministic last tie-breaker, so ties spread instead of
always landing on the first candidate."""

from __future__ import annotations

from collections.abc import Sequence


class Rotation:
    def __init__(self) -> None:
        self._count = 0

    def start(self, n: int) -> int:
        s = self._count % n
        self._count += 1
        return s


def rotated(indices: Sequence[int], start: int) -> list[int]:
    """`indices` starting at position `start` (mod their count), wrapping around."""
    s = start % len(indices)
    return [*indices[s:], *indices[:s]]
