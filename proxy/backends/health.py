"""The one owner of backend health: whether a backend takes new requests, and why not.

Every judgement about a backend's health reaches this component, which alone changes its
`healthy` flag and its ejections:
- passive health, from requests: a refused connection takes the backend out until its next
  passing health check; a stream that broke or stalled after output reached the client
  takes it out the same way (a passive ejection); every failure and success also feeds
  outcome-based ejection (`EjectionGuard`, whose ticks also find stalled backends);
- active health, from the health checks: fleet/scrape.py reports each result here, and
  fleet/health.py's rule turns the results into health.

When a backend is found down or stalled, its live requests leave it at once rather than wait
out `read_timeout` (moved, or sent again where nothing reached the client yet).
"""

from __future__ import annotations

import asyncio
import logging

from fleet.clock import IDLE_BEAT_S, Clock, to_next_beat
from fleet.health import judge_check
from fleet.live import LiveTable
from fleet.outliers import Eject, EjectionState
from fleet.registry import FleetRegistry
from fleet.types import Backend
from proxy.backends.ejection import EjectionGuard
from proxy.errors import FailureKind
from proxy.metrics import RouterMetrics
from proxy.settings import Settings

log = logging.getLogger("fleet_proxy.health")
ejection_log = logging.getLogger("fleet_proxy.ejection")

# How often ejections are ended and stalls looked for: on the process's idle beat.
TICK_S = IDLE_BEAT_S


class BackendHealth:
    def __init__(
        self,
        settings: Settings,
        fleet: FleetRegistry,
        live: LiveTable,
        metrics: RouterMetrics,
        clock: Clock,
    ) -> None:
        self.fleet = fleet
        self.live = live
        self.metrics = metrics
        self.clock = clock
        self.ejection = EjectionGuard(settings, fleet, live, clock)
        self.unhealthy_after = settings.unhealthy_after
        # Failed health checks in a row, by backend id, with the backend they count for: one
        # removed and added again under its id is a new object and starts from none.
        self._failed_checks: dict[str, tuple[Backend, int]] = {}
        fleet.on_removed(self._forget)

    def ejection_state(self, backend_id: str) -> EjectionState | None:
        """The backend's outcome-based ejection now, if it is ejected."""
        return self.ejection.state(backend_id)

    # --- what requests report

    def failed_before_answer(self, backend: Backend, kind: FailureKind, detail: str) -> None:
        """A leg failed before anything of its answer reached the client."""
        self.metrics.count_upstream_error(backend.id, kind)
        self._eject(backend, self.ejection.failed(backend, kind))
        backend.last_error = detail
        if kind == "connect":
            # Refused: stop sending here until the next health check says otherwise.
            backend.healthy = False

    def failed_mid_stream(self, backend: Backend, kind: FailureKind, detail: str) -> None:
        """A stream broke or stalled after output reached its client: no new requests until
        the backend's next passing health check (a passive ejection)."""
        self.metrics.count_upstream_error(backend.id, kind)
        self._eject(backend, self.ejection.failed(backend, kind))
        backend.last_error = f"{kind}: {detail}"
        if backend.healthy:
            backend.healthy = False
            self.metrics.count_passive_ejection(backend.id, kind)

    def failed_under_suspect(self, backend: Backend, kind: FailureKind, detail: str) -> None:
        """A leg failed under a request that had just made another backend fail too: the
        request more likely than the backend is the cause, so the failure is counted and
        shown but held against neither its ejection nor its health."""
        self.metrics.count_upstream_error(backend.id, kind)
        backend.last_error = f"{kind}: {detail} (under a request that failed elsewhere too)"

    def succeeded(self, backend: Backend) -> None:
        """A leg got its first output (or its whole answer) from `backend`."""
        self.ejection.succeeded(backend)

    # --- what the health checks report (fleet.health.HealthReports)

    def check_passed(self, backend: Backend) -> None:
        self._checked(backend, ok=True, detail="")

    def check_failed(self, backend: Backend, detail: str) -> None:
        backend.last_error = detail
        self._checked(backend, ok=False, detail=detail)

    def _checked(self, backend: Backend, ok: bool, detail: str) -> None:
        counted = self._failed_checks.get(backend.id)
        failures = counted[1] if counted is not None and counted[0] is backend else 0
        verdict = judge_check(ok, backend.healthy, failures, self.unhealthy_after)
        self._failed_checks[backend.id] = (backend, verdict.failures)
        if verdict.healthy:
            if not backend.healthy:
                log.warning("backend %s is now healthy", backend.id)
        elif backend.healthy:  # the reason in the line: a dead backend's cause is in the log
            log.warning("backend %s is now unhealthy: %s", backend.id, detail)
        backend.healthy = verdict.healthy
        if verdict.went_down:
            self._free(backend, "its backend was found down by a health check")

    # --- outcome-based ejection's loop

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(to_next_beat(loop.time(), TICK_S))
            try:
                self.tick()
            except Exception:  # one bad tick must not end ejection for good
                ejection_log.exception("ejection tick failed")

    def tick(self) -> None:
        """End the ejections that are over; take stalled backends out, and their requests
        off them."""
        found = self.ejection.tick()
        for restore in found.ended:
            backend = self.fleet.get(restore.backend_id)
            if backend is not None:
                backend.ejected_until = 0.0
            ejection_log.warning(
                "backend %s is back in routing after its ejection (%s), on probation",
                restore.backend_id, restore.reason,
            )  # fmt: skip
        for backend, action in found.ejected:
            self._eject(backend, action)
        for backend in found.stalled_out:
            self._free(backend, "its backend stalled")

    def _eject(self, backend: Backend, action: Eject | None) -> None:
        if action is None:
            return
        backend.ejected_until = action.until
        self.metrics.count_ejection(backend.id, action.reason)
        ejection_log.warning(
            "backend %s ejected for %.0fs (%s; ejection %d in a row)",
            backend.id, action.until - self.clock.now(), action.reason, action.ejections,
        )  # fmt: skip
        if action.reason == "stalled":
            # Its requests would wait out read_timeout: they leave it now (sent again where
            # nothing reached the client, continued elsewhere where something did).
            self._free(backend, "its backend stalled")

    def _free(self, backend: Backend, why: str) -> None:
        for entry in self.live.on_backend(backend.id):
            entry.backend_down(why)

    def _forget(self, backend_id: str) -> None:
        self._failed_checks.pop(backend_id, None)
