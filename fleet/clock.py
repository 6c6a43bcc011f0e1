"""Clocks are injected so that decision code and staleness checks can be tested without sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        self._t += seconds


def to_next_beat(now: float, period: float) -> float:
    """Seconds from `now` to the next multiple of `period` on the same clock. Periodic tasks
    that sleep this long rather than `period` wake together, the loop once per beat for all of
    them: each wake-up of an idle process costs more CPU than most periodic work."""
    return period - (now % period)
