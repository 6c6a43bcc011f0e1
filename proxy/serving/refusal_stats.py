"""What every client connection of one server shares: the count of open connections, and the
refusals, counted in `fleet_proxy_client_connections_refused_total{reason}` and reported in
one warning line at most every `WARN_EVERY_S` seconds."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.metrics import RouterMetrics

# The front door's logger: its refusal reports are what an operator searches for.
log = logging.getLogger("fleet_proxy.front_door")

# At most one warning line per this many seconds about refused connections.
WARN_EVERY_S = 10.0

REASONS = (
    "header_too_large",
    "too_many_headers",
    "header_timeout",
    "body_timeout",
    "body_too_large",
    "connection_limit",
    "bad_request",
    # Closed to make room in a full connection table (proxy/serving/connection_table.py),
    # by what the connection had sent of its request.
    "evicted_idle",
    "evicted_head",
    "evicted_body",
)


class FrontDoorStats:
    """The count of open connections (uvicorn's own set of them), and the refusals, counted in
    the metrics and reported in a warning line at most once per `warn_every` seconds with the
    count since the last line."""

    def __init__(
        self,
        metrics: RouterMetrics | None,
        *,
        warn_every: float = WARN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connections: set[Any] = set()  # replaced by the server's set once it has one
        self._metrics = metrics
        self._warn_every = warn_every
        self._clock = clock
        self._last_warning = -math.inf
        self._unreported: dict[str, int] = {}
        # The state of the last connection refused for a reason, where the refusal gave it:
        # what tells a client's own slowness from a connection the server mistook for idle.
        self._details: dict[str, str] = {}
        if metrics is not None:
            metrics.client_connections.set_function(lambda: len(self.connections))
            for reason in REASONS:  # each series from 0, for rates and alerts
                metrics.client_refused.labels(reason)

    def refused(self, reason: str, detail: str = "") -> None:
        if self._metrics is not None:
            self._metrics.client_refused.labels(reason).inc()
        self._unreported[reason] = self._unreported.get(reason, 0) + 1
        if detail:
            self._details[reason] = detail
        now = self._clock()
        if now - self._last_warning < self._warn_every:
            return
        self._last_warning = now
        counts = ", ".join(f"{r} {n}" for r, n in sorted(self._unreported.items()))
        total = sum(self._unreported.values())
        self._unreported = {}
        details = "".join(f"; last {r}: {d}" for r, d in sorted(self._details.items()))
        self._details = {}
        log.warning(
            "refused %d client connection(s) since the last report (%s); %d open%s",
            total,
            counts,
            len(self.connections),
            details,
        )
