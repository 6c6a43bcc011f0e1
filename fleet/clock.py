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


# The period on which a process's cheap periodic tasks wake together while it is idle (the
# default scrape_interval, so a further worker's reads of the first worker's scrapes share the
# wake-up): each wake-up of an idle process costs about 200 us of CPU, more than their work.
IDLE_BEAT_S = 0.2


def to_next_beat(now: float, period: float) -> float:
    """Seconds from `now` to the next multiple of `period` on the same clock. Periodic tasks
    that sleep this long rather than `period` wake together, the loop once per beat for all of
    them: each wake-up of an idle process costs more CPU than most periodic work.

    A task woken on a beat may read a clock a hair short of it (uvloop's clock counts whole
    milliseconds, and 0.2 has no exact binary form, so 1234.6 % 0.2 is 0.1999...): within 1%
    of a period before a beat counts as on it, and the next beat is a whole period on, not
    one due at once."""
    delay = period - (now % period)
    return delay if delay > period * 0.01 else delay + period
