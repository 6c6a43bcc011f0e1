"""The last choices of a picker, counted per backend: what a spread guard reads.

Counts decisions, not seconds (no clock), so a window means the same at any request rate."""

from __future__ import annotations

from collections import deque


class SpreadWindow:
    __slots__ = ("_counts", "_window")

    def __init__(self, size: int) -> None:
        self._window: deque[str] = deque(maxlen=size)
        self._counts: dict[str, int] = {}

    def recent(self, backend_id: str) -> int:
        """Times `backend_id` was chosen in the window."""
        return self._counts.get(backend_id, 0)

    def warm(self, warmup: int) -> bool:
        """Whether the window holds `warmup` choices (or is full, if it is smaller)."""
        return len(self._window) >= min(warmup, self._window.maxlen or warmup)

    def remember(self, backend_id: str) -> None:
        window = self._window
        if len(window) == window.maxlen:
            self._counts[window[0]] -= 1
        window.append(backend_id)
        self._counts[backend_id] = self._counts.get(backend_id, 0) + 1
