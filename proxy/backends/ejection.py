"""Outcome-based ejection for this process: requests report how their backends did, each tick
ends ejections and finds stalled backends. The decisions are fleet/outliers.py's; the guard
keeps their state and says what to do, and the owner of backend health
(proxy/backends/health.py) applies it to the backends, the metrics and the live requests.

With `--workers N` each worker process judges the backends by its own requests.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from fleet.clock import Clock
from fleet.live import LiveTable
from fleet.outliers import (
    BackendActivity,
    CapReached,
    Eject,
    EjectionState,
    OutlierDetector,
    OutlierSettings,
    Restore,
    stalled_backends,
)
from fleet.registry import FleetRegistry
from fleet.types import Backend
from proxy.errors import FailureKind
from proxy.settings import Settings

log = logging.getLogger("fleet_proxy.ejection")

# A refused ejection (the fleet-share cap) is logged at most this often per backend.
CAP_LOG_EVERY_S = 10.0


class EjectionTick(NamedTuple):
    """What one tick found."""

    ended: list[Restore]  # ejections over: those backends are back in routing
    ejected: list[tuple[Backend, Eject]]  # stalled backends to take out now
    # Out already for a stall, yet a request waits there: one that was still connecting
    # when the ejection freed the others. It leaves now, not after read_timeout.
    stalled_out: list[Backend]


class EjectionGuard:
    def __init__(
        self, settings: Settings, fleet: FleetRegistry, live: LiveTable, clock: Clock
    ) -> None:
        self.enabled = settings.outlier_detection
        self.stall_after = settings.stall_timeout
        self.detector = OutlierDetector(
            OutlierSettings(
                consecutive_failures=settings.outlier_consecutive_failures,
                window_s=settings.outlier_window,
                base_ejection_s=settings.outlier_base_ejection,
                max_ejection_s=settings.outlier_max_ejection,
                max_ejected_fraction=settings.outlier_max_ejected_fraction,
            )
        )
        self.fleet = fleet
        self.live = live
        self.clock = clock
        self._cap_logged: dict[str, float] = {}
        fleet.on_removed(self._forget)

    def state(self, backend_id: str) -> EjectionState | None:
        """The backend's ejection now, if it is ejected."""
        return self.detector.state(backend_id)

    # --- what requests report

    def failed(self, backend: Backend, kind: FailureKind) -> Eject | None:
        """A request failed on `backend` (5xx, connection, stream cut or stalled): the
        ejection to apply, if that made one."""
        if not self.enabled:
            return None
        now = self.clock.now()
        action = self.detector.failure(backend.id, kind, now, len(self.fleet))
        return None if action is None else self._allowed(backend, action, now)

    def succeeded(self, backend: Backend) -> None:
        """A request got its first output (or its whole answer) from `backend`."""
        if self.enabled:
            self.detector.success(backend.id)

    # --- the loop's tick

    def tick(self) -> EjectionTick:
        found = EjectionTick([], [], [])
        if not self.enabled:
            return found
        now = self.clock.now()
        found.ended.extend(self.detector.due(now))
        for backend_id in stalled_backends(self._activity(), now, self.stall_after):
            backend = self.fleet.get(backend_id)
            if backend is None:
                continue
            action = self.detector.stalled(backend_id, now, len(self.fleet))
            if action is not None:
                eject = self._allowed(backend, action, now)
                if eject is not None:
                    found.ejected.append((backend, eject))
                continue
            state = self.detector.state(backend_id)
            if state is not None and state.reason == "stalled":
                found.stalled_out.append(backend)
        return found

    def _activity(self) -> list[BackendActivity]:
        waits: dict[str, float] = {}
        reads: dict[str, float] = {}
        for entry in self.live:
            backend_id = entry.backend_id
            if not backend_id:
                continue
            since = entry.waiting_since()
            if since is not None and since < waits.get(backend_id, float("inf")):
                waits[backend_id] = since
            read = entry.last_read()
            if read > reads.get(backend_id, 0.0):
                reads[backend_id] = read
        out: list[BackendActivity] = []
        for backend_id, since in waits.items():
            backend = self.fleet.get(backend_id)
            if backend is None:
                continue
            out.append(
                BackendActivity(backend_id, since, reads.get(backend_id, 0.0), backend.progress_at)
            )
        return out

    def _allowed(self, backend: Backend, action: Eject | CapReached, now: float) -> Eject | None:
        if isinstance(action, CapReached):
            last = self._cap_logged.get(backend.id, -CAP_LOG_EVERY_S)
            if now - last >= CAP_LOG_EVERY_S:
                self._cap_logged[backend.id] = now
                log.warning(
                    "backend %s keeps failing (%s) but stays in routing: %d backend(s) are "
                    "ejected already, the most outlier_max_ejected_fraction allows",
                    backend.id, action.reason, action.ejected,
                )  # fmt: skip
            return None
        return action

    def _forget(self, backend_id: str) -> None:
        self.detector.forget(backend_id)
        self._cap_logged.pop(backend_id, None)
