"""Outcome-based ejection, wired to the proxy: requests report how their backends did, a
background loop ends ejections and finds stalled backends. The decisions are
fleet/outliers.py's; this applies them to the backends, the log and the metrics.

With `--workers N` each worker process judges the backends by its own requests.
"""

from __future__ import annotations

import asyncio
import logging

from fleet.clock import Clock
from fleet.live import LiveTable
from fleet.outliers import (
    BackendActivity,
    CapReached,
    Eject,
    OutlierDetector,
    OutlierSettings,
    stalled_backends,
)
from fleet.registry import FleetRegistry
from fleet.types import Backend
from proxy.errors import FailureKind
from proxy.metrics import RouterMetrics
from proxy.settings import Settings

log = logging.getLogger("fleet_proxy.ejection")

# How often ejections are ended and stalls looked for.
TICK_S = 0.25
# A refused ejection (the fleet-share cap) is logged at most this often per backend.
CAP_LOG_EVERY_S = 10.0


class EjectionGuard:
    def __init__(
        self,
        settings: Settings,
        fleet: FleetRegistry,
        live: LiveTable,
        metrics: RouterMetrics,
        clock: Clock,
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
        self.metrics = metrics
        self.clock = clock
        self._cap_logged: dict[str, float] = {}
        fleet.on_removed(self._forget)

    # --- what requests report

    def failed(self, backend: Backend, kind: FailureKind) -> None:
        """A request failed on `backend` (5xx, connection, stream cut or stalled)."""
        if not self.enabled:
            return
        now = self.clock.now()
        action = self.detector.failure(backend.id, kind, now, len(self.fleet))
        if action is not None:
            self._apply(backend, action, now)

    def succeeded(self, backend: Backend) -> None:
        """A request got its first output (or its whole answer) from `backend`."""
        if self.enabled:
            self.detector.success(backend.id)

    # --- the loop

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick()
            except Exception:  # one bad tick must not end ejection for good
                log.exception("ejection tick failed")

    def tick(self) -> None:
        if not self.enabled:
            return
        now = self.clock.now()
        for restore in self.detector.due(now):
            backend = self.fleet.get(restore.backend_id)
            if backend is not None:
                backend.ejected_until = 0.0
            log.warning(
                "backend %s is back in routing after its ejection (%s), on probation",
                restore.backend_id, restore.reason,
            )  # fmt: skip
        for backend_id in stalled_backends(self._activity(), now, self.stall_after):
            backend = self.fleet.get(backend_id)
            if backend is None:
                continue
            action = self.detector.stalled(backend_id, now, len(self.fleet))
            if action is not None:
                self._apply(backend, action, now)
                continue
            state = self.detector.state(backend_id)
            if state is not None and state.reason == "stalled":
                # Out already, yet a request waits there: one that was still connecting when
                # the ejection freed the others. It leaves now, not after read_timeout.
                self._free(backend, "its backend stalled")

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

    def _apply(self, backend: Backend, action: Eject | CapReached, now: float) -> None:
        if isinstance(action, CapReached):
            last = self._cap_logged.get(backend.id, -CAP_LOG_EVERY_S)
            if now - last >= CAP_LOG_EVERY_S:
                self._cap_logged[backend.id] = now
                log.warning(
                    "backend %s keeps failing (%s) but stays in routing: %d backend(s) are "
                    "ejected already, the most outlier_max_ejected_fraction allows",
                    backend.id, action.reason, action.ejected,
                )  # fmt: skip
            return
        backend.ejected_until = action.until
        self.metrics.count_ejection(backend.id, action.reason)
        log.warning(
            "backend %s ejected for %.0fs (%s; ejection %d in a row)",
            backend.id, action.until - now, action.reason, action.ejections,
        )  # fmt: skip
        if action.reason == "stalled":
            # Its requests would wait out read_timeout: they leave it now (sent again where
            # nothing reached the client, continued elsewhere where something did).
            self._free(backend, "its backend stalled")

    def _free(self, backend: Backend, why: str) -> None:
        for entry in self.live.on_backend(backend.id):
            entry.backend_down(why)

    def _forget(self, backend_id: str) -> None:
        self.detector.forget(backend_id)
        self._cap_logged.pop(backend_id, None)
