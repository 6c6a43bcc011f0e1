"""The one owner of backend health: whether a backend takes new requests, and why not.

Every judgement about a backend's health reaches this component, which alone changes its
`healthy` flag and ejections:
- passive health, from requests: a refused connection takes the backend out until its next
  passing health check; a stream that broke or stalled after output reached the client
  takes it out the same way (a passive ejection); every failure and success also feeds
  outcome-based ejection (`EjectionGuard`, fleet/outliers.py's rules);
- active health, from the health checks (fleet/scrape.py reports each result here).

When a backend is found down, its live requests leave it at once rather than wait out
`read_timeout` (moved, or sent again where nothing reached the client yet).
"""

from __future__ import annotations

from fleet.live import LiveTable
from fleet.types import Backend
from proxy.backends.ejection import EjectionGuard
from proxy.errors import FailureKind
from proxy.metrics import RouterMetrics


class BackendHealth:
    def __init__(self, live: LiveTable, metrics: RouterMetrics, ejection: EjectionGuard) -> None:
        self.live = live
        self.metrics = metrics
        self.ejection = ejection

    # --- what requests report

    def failed_before_answer(self, backend: Backend, kind: FailureKind, detail: str) -> None:
        """A leg failed before anything of its answer reached the client."""
        self.metrics.count_upstream_error(backend.id, kind)
        self.ejection.failed(backend, kind)
        backend.last_error = detail
        if kind == "connect":
            # Refused: stop sending here until the next health check says otherwise.
            backend.healthy = False

    def failed_mid_stream(self, backend: Backend, kind: FailureKind, detail: str) -> None:
        """A stream broke or stalled after output reached its client: no new requests until
        the backend's next passing health check (a passive ejection)."""
        self.metrics.count_upstream_error(backend.id, kind)
        self.ejection.failed(backend, kind)
        backend.last_error = f"{kind}: {detail}"
        if backend.healthy:
            backend.healthy = False
            self.metrics.count_passive_ejection(backend.id, kind)

    def succeeded(self, backend: Backend) -> None:
        """A leg got its first output (or its whole answer) from `backend`."""
        self.ejection.succeeded(backend)

    # --- what the health checks report

    def found_down(self, backend: Backend) -> None:
        """The health checks took `backend` out: its live requests leave it now."""
        for entry in self.live.on_backend(backend.id):
            entry.backend_down("its backend was found down by a health check")
