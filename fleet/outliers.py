"""Outcome-based ejection (outlier detection): the decisions, without I/O or a clock of their own.

A backend whose requests keep failing is taken out of routing for a while, even when its
`/health` still answers (an engine answering 500 to everything, or accepting requests and
never answering them):

- `consecutive_failures` failures in a row (5xx answers, refused or broken connections,
  streams cut or stalled), each within `window_s` of the previous one, eject it;
- an ejection lasts `base_ejection_s`, doubled for each ejection since the backend last went
  `max_ejection_s` without one, capped at `max_ejection_s`;
- back from an ejection, the backend is on probation: its next failure ejects it again at
  once, its next success ends the probation;
- at most `max_ejected_fraction` of the fleet is ejected at once (never less than one backend),
  so a fault that makes every backend fail, such as a bad request pattern, cannot empty it;
- a backend found stalled (`stalled_backends`) is ejected at once.

`OutlierDetector` keeps the per-backend state and returns what to do; the caller applies it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OutlierSettings:
    consecutive_failures: int = 5
    window_s: float = 30.0
    base_ejection_s: float = 10.0
    max_ejection_s: float = 300.0
    max_ejected_fraction: float = 0.5


@dataclass(frozen=True, slots=True)
class Eject:
    backend_id: str
    reason: str
    until: float
    ejections: int  # in a row, this one included


@dataclass(frozen=True, slots=True)
class CapReached:
    """An ejection the fleet-share cap refused; the failures keep counting."""

    backend_id: str
    reason: str
    ejected: int


@dataclass(frozen=True, slots=True)
class Restore:
    backend_id: str
    reason: str  # why it had been ejected


@dataclass(slots=True)
class _Record:
    consecutive: int = 0
    last_failure_at: float = -math.inf
    ejections: int = 0
    ejected_until: float | None = None
    last_ejected_at: float = -math.inf
    probation: bool = False
    reason: str = ""
    kinds: dict[str, int] = field(default_factory=dict)  # failure kinds of the current run


@dataclass(frozen=True, slots=True)
class EjectionState:
    reason: str
    until: float
    ejections: int


class OutlierDetector:
    def __init__(self, settings: OutlierSettings) -> None:
        self.settings = settings
        self._records: dict[str, _Record] = {}

    def failure(
        self, backend_id: str, kind: str, now: float, fleet_size: int
    ) -> Eject | CapReached | None:
        """A request failed on `backend_id` for a reason of the backend's (not the client's)."""
        rec = self._records.get(backend_id)
        if rec is None:
            rec = self._records[backend_id] = _Record()
        if rec.ejected_until is not None:
            return None  # already out: failures of requests sent before count for nothing
        if now - rec.last_failure_at > self.settings.window_s:
            rec.consecutive = 0
            rec.kinds.clear()
        rec.consecutive += 1
        rec.kinds[kind] = rec.kinds.get(kind, 0) + 1
        rec.last_failure_at = now
        if rec.probation or rec.consecutive >= self.settings.consecutive_failures:
            return self._eject(backend_id, rec, _dominant(rec.kinds), now, fleet_size)
        return None

    def stalled(self, backend_id: str, now: float, fleet_size: int) -> Eject | CapReached | None:
        rec = self._records.get(backend_id)
        if rec is None:
            rec = self._records[backend_id] = _Record()
        if rec.ejected_until is not None:
            return None
        return self._eject(backend_id, rec, "stalled", now, fleet_size)

    def success(self, backend_id: str) -> None:
        """A request got its answer (or its first token) from `backend_id`."""
        rec = self._records.get(backend_id)
        if rec is not None and (rec.consecutive or rec.probation):
            rec.consecutive = 0
            rec.kinds.clear()
            rec.probation = False

    def due(self, now: float) -> list[Restore]:
        """Ejections that ended by `now`; those backends are routable again, on probation."""
        out: list[Restore] = []
        for backend_id, rec in self._records.items():
            if rec.ejected_until is not None and now >= rec.ejected_until:
                rec.ejected_until = None
                rec.probation = True
                rec.consecutive = 0
                rec.kinds.clear()
                out.append(Restore(backend_id, rec.reason))
        return out

    def state(self, backend_id: str) -> EjectionState | None:
        rec = self._records.get(backend_id)
        if rec is None or rec.ejected_until is None:
            return None
        return EjectionState(rec.reason, rec.ejected_until, rec.ejections)

    def ejected(self) -> int:
        return sum(1 for r in self._records.values() if r.ejected_until is not None)

    def forget(self, backend_id: str) -> None:
        self._records.pop(backend_id, None)

    def _eject(
        self, backend_id: str, rec: _Record, reason: str, now: float, fleet_size: int
    ) -> Eject | CapReached:
        s = self.settings
        ejected = self.ejected()
        if ejected >= max(1, math.floor(s.max_ejected_fraction * fleet_size)):
            return CapReached(backend_id, reason, ejected)
        if now - rec.last_ejected_at > s.max_ejection_s + self._duration(rec.ejections):
            rec.ejections = 0  # long enough without trouble: the back-off starts over
        rec.ejections += 1
        rec.ejected_until = now + self._duration(rec.ejections)
        rec.last_ejected_at = now
        rec.reason = reason
        rec.consecutive = 0
        rec.kinds.clear()
        rec.probation = False
        return Eject(backend_id, reason, rec.ejected_until, rec.ejections)

    def _duration(self, ejections: int) -> float:
        s = self.settings
        if ejections <= 0:
            return 0.0
        return min(s.max_ejection_s, s.base_ejection_s * float(2 ** min(ejections - 1, 30)))


def _dominant(kinds: dict[str, int]) -> str:
    return max(kinds.items(), key=lambda kv: kv[1])[0] if kinds else "failures"


@dataclass(frozen=True, slots=True)
class BackendActivity:
    """What says whether a backend is working on the proxy's requests."""

    backend_id: str
    # When the longest-waiting request on it began waiting for its first output (None: none
    # waits).
    oldest_wait_since: float | None
    last_read: float  # the last byte read from it on any request
    engine_progress_at: float | None  # the last scrape whose counters showed work done


def stalled_backends(
    activity: Iterable[BackendActivity], now: float, stall_after: float
) -> list[str]:
    """Backends holding a request that waited `stall_after` for its first output while
    nothing at all came from them, and their engine's counters showed no work, for as long.

    A busy engine with a long queue sends other requests' tokens or advances its step and
    token counters, so it is not stalled; an idle engine that never starts a request, or a
    frozen one, is."""
    out: list[str] = []
    for a in activity:
        since = a.oldest_wait_since
        if since is None or now - since <= stall_after:
            continue
        if now - a.last_read <= stall_after:
            continue
        progress = a.engine_progress_at
        if progress is not None and now - progress <= stall_after:
            continue
        out.append(a.backend_id)
    return out
