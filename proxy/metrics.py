"""The router's own Prometheus metrics, in the app's registry (no process-global registry).

Per-backend state is exported by a collector that reads it at scrape time, so the hot path
pays nothing for it; the hot path only bumps pre-bound counters and histograms.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleet.clock import Clock
from fleet.lean_histogram import LeanHistogram
from fleet.registry import FleetRegistry
from proxy.errors import FailureKind

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


# The `model` label of a request whose model no backend serves (or that named none): a client
# must not be able to add series by making names up.
UNKNOWN_MODEL = "unknown"


class RouterMetrics:
    """`serves(model)`: whether a backend serves that model name, which then labels the
    request series; other names count as `unknown`, so the series are bounded by the models
    the fleet has served."""

    def __init__(
        self, registry: CollectorRegistry, serves: Callable[[str], bool] | None = None
    ) -> None:
        self.registry = registry
        self._serves = serves or (lambda _: False)
        self.requests = Counter(
            "fleet_proxy_requests",
            "Requests answered by the proxy, by endpoint, model (as the backends name it; "
            "unknown for any other name) and HTTP status",
            ["endpoint", "model", "status"],
            registry=registry,
        )
        self.retries = Counter(
            "fleet_proxy_retries",
            "Requests sent again to another backend before their first byte",
            ["reason"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "fleet_proxy_upstream_errors",
            "Failures talking to a backend, by kind: connect (refused), connect_timeout, io, "
            "status (a 5xx answer), mid_stream, stalled",
            ["backend", "kind"],
            registry=registry,
        )
        self.client_disconnects = Counter(
            "fleet_proxy_client_disconnects",
            "Requests whose client went away before the end; the backend request was closed",
            registry=registry,
        )
        self.pd_prefill_legs = Counter(
            "fleet_proxy_pd_prefill_legs",
            "Prefill legs run by the proxy in orchestrated P/D mode, by outcome",
            ["outcome"],
            registry=registry,
        )
        self.ttft = LeanHistogram(
            "fleet_proxy_time_to_first_byte_seconds",
            "From request arrival to the first body byte relayed",
            ["endpoint", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.duration = LeanHistogram(
            "fleet_proxy_request_duration_seconds",
            "From request arrival to the last byte relayed",
            ["endpoint", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.migrations = Counter(
            "fleet_proxy_migrations",
            "Requests moved to another backend mid-stream, by reason (backend_failed, "
            "backend_stalled, or the planned move's reason) and outcome (ok: the target sent its "
            "first token; failed: no backend could continue; not_movable)",
            ["reason", "outcome"],
            registry=registry,
        )
        self.migration_downtime = Histogram(
            "fleet_proxy_migration_downtime_seconds",
            "From the last token relayed from the source to the first from the target, "
            "as the client sees it",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.migration_recomputed_tokens = Counter(
            "fleet_proxy_migration_recomputed_tokens",
            "Tokens a move's target prefilled again (prompt + tokens already generated)",
            registry=registry,
        )
        # By kind in series of their own: the metrics above keep their label sets.
        self.migrations_by_kind = Counter(
            "fleet_proxy_migrations_by_kind",
            "Moves by how the KV reached the target (recompute, handover, precopy) and outcome "
            "(ok, failed)",
            ["kind", "outcome"],
            registry=registry,
        )
        self.migration_downtime_by_kind = Histogram(
            "fleet_proxy_migration_downtime_by_kind_seconds",
            "fleet_proxy_migration_downtime_seconds by how the KV reached the target",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.migration_kv_legs = Counter(
            "fleet_proxy_migration_kv_legs",
            "KV legs of handover and pre-copy moves (the source's 1-token do_remote_decode "
            "request, a pre-copy's pull on the target), by kind and outcome (ok, or why it "
            "failed: the move then recomputes)",
            ["kind", "outcome"],
            registry=registry,
        )
        self.not_movable = Counter(
            "fleet_proxy_requests_not_movable",
            "Generation requests that cannot move to another backend mid-stream, by reason",
            ["reason"],
            registry=registry,
        )
        self.passive_ejections = Counter(
            "fleet_proxy_passive_ejections",
            "Backends taken out of routing by what a request saw (mid_stream, stalled) until "
            "their next passing health check",
            ["backend", "reason"],
            registry=registry,
        )
        self.ejections = Counter(
            "fleet_proxy_backend_ejections",
            "Backends taken out of routing for a back-off period by their requests' outcomes "
            "(consecutive failures, or stalled), by the most frequent failure kind",
            ["backend", "reason"],
            registry=registry,
        )
        # Label values in use per backend, so that a removed backend's series go with it.
        self._backend_series: dict[str, set[tuple[Counter, tuple[str, str]]]] = {}
        self.client_refused = Counter(
            "fleet_proxy_client_connections_refused",
            "Client connections the proxy's HTTP server refused and closed, by reason: "
            "header_too_large, too_many_headers (431), header_timeout, body_timeout (408; a "
            "connection that never sent a byte gets no answer), body_too_large (413), "
            "connection_limit (503), bad_request (400)",
            ["reason"],
            registry=registry,
        )
        self.client_connections = Gauge(
            "fleet_proxy_client_connections",
            "Client connections open to this serving process",
            registry=registry,
        )
        self.body_bytes_in_flight = Gauge(
            "fleet_proxy_body_bytes_in_flight",
            "Request-body bytes this serving process holds (max_body_bytes_in_flight bounds it)",
            registry=registry,
        )
        self.body_budget_refusals = Counter(
            "fleet_proxy_body_budget_refusals",
            "Requests answered 503 because their body found no room under "
            "max_body_bytes_in_flight in time",
            registry=registry,
        )
        self.failed_in_a_row = Counter(
            "fleet_proxy_requests_failed_in_a_row",
            "Requests stopped after making max_backends_failed_in_a_row backends fail one "
            "after another, by stage: first (before the answer), continuation (mid-stream)",
            ["stage"],
            registry=registry,
        )
        # labels() locks and hashes on every call: keep the bound children.
        self._request_children: dict[tuple[str, int, str], Callable[[], None]] = {}
        self._ttft_children: dict[tuple[str, str], Callable[[float], None]] = {}
        self._duration_children: dict[tuple[str, str], Callable[[float], None]] = {}
        self._not_movable_children: dict[str, Callable[[], None]] = {}

    def count_request(self, endpoint: str, status: int, model: str | None = None) -> None:
        children = self._request_children
        inc = children.get((endpoint, status, model or UNKNOWN_MODEL))
        if inc is None:
            if model is not None and self._serves(model):
                inc = self.requests.labels(endpoint, model, str(status)).inc
                children[(endpoint, status, model)] = inc
            else:
                # Kept under `unknown`, never the client's name: made-up names would grow
                # this dict as they would the series.
                unknown = (endpoint, status, UNKNOWN_MODEL)
                inc = children.get(unknown)
                if inc is None:
                    inc = self.requests.labels(endpoint, UNKNOWN_MODEL, str(status)).inc
                    children[unknown] = inc
        inc()

    def _count_backend(self, metric: Counter, backend_id: str, label: str) -> None:
        self._backend_series.setdefault(backend_id, set()).add((metric, (backend_id, label)))
        metric.labels(backend_id, label).inc()

    def count_upstream_error(self, backend_id: str, kind: FailureKind) -> None:
        self._count_backend(self.upstream_errors, backend_id, kind)

    def count_passive_ejection(self, backend_id: str, reason: str) -> None:
        self._count_backend(self.passive_ejections, backend_id, reason)

    def count_ejection(self, backend_id: str, reason: str) -> None:
        self._count_backend(self.ejections, backend_id, reason)

    def forget_backend(self, backend_id: str) -> None:
        """A removed backend's series leave /metrics (a fleet that churns would grow them)."""
        for metric, labels in self._backend_series.pop(backend_id, ()):
            with contextlib.suppress(KeyError):
                metric.remove(*labels)

    def count_migration(self, reason: str, outcome: str) -> None:
        self.migrations.labels(reason, outcome).inc()

    def count_migration_kind(self, kind: str, outcome: str) -> None:
        self.migrations_by_kind.labels(kind, outcome).inc()

    def count_not_movable(self, reason: str) -> None:
        inc = self._not_movable_children.get(reason)
        if inc is None:
            inc = self._not_movable_children[reason] = self.not_movable.labels(reason).inc
        inc()

    # A request with a first byte or an end was routed, so a backend serves its model: the
    # name is one of the fleet's.

    def observe_ttft(self, endpoint: str, model: str, seconds: float) -> None:
        observe = self._ttft_children.get((endpoint, model))
        if observe is None:
            observe = self.ttft.labels(endpoint, model).observe
            self._ttft_children[(endpoint, model)] = observe
        observe(seconds)

    def observe_duration(self, endpoint: str, model: str, seconds: float) -> None:
        observe = self._duration_children.get((endpoint, model))
        if observe is None:
            observe = self.duration.labels(endpoint, model).observe
            self._duration_children[(endpoint, model)] = observe
        observe(seconds)


class BackendStateCollector(Collector):
    """Exports each backend's accounting and last scrape when Prometheus asks."""

    def __init__(self, fleet: FleetRegistry, clock: Clock) -> None:
        self.fleet = fleet
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock.now()
        labels = ["backend", "role"]
        fams = {
            "in_flight": GaugeMetricFamily(
                "fleet_proxy_backend_in_flight", "Requests in flight via this proxy", labels=labels
            ),
            "peer_in_flight": GaugeMetricFamily(
                "fleet_proxy_backend_peer_in_flight",
                "Requests in flight via this proxy's other worker processes (--workers N)",
                labels=labels,
            ),
            "pending": GaugeMetricFamily(
                "fleet_proxy_backend_pending_prefill_tokens",
                "Prompt tokens dispatched and not yet past their first token",
                labels=labels,
            ),
            "decodes": GaugeMetricFamily(
                "fleet_proxy_backend_running_decodes",
                "Requests past their first token",
                labels=labels,
            ),
            "healthy": GaugeMetricFamily(
                "fleet_proxy_backend_healthy", "1 when the last health check passed", labels=labels
            ),
            "routable": GaugeMetricFamily(
                "fleet_proxy_backend_routable",
                "1 when healthy, not draining, not ejected and its scrape is fresh",
                labels=labels,
            ),
            "ejected": GaugeMetricFamily(
                "fleet_proxy_backend_ejected",
                "1 while the backend is ejected for its requests' outcomes",
                labels=labels,
            ),
            "age": GaugeMetricFamily(
                "fleet_proxy_backend_snapshot_age_seconds",
                "Age of the last successful /metrics scrape",
                labels=labels,
            ),
        }
        for b in self.fleet:
            lv = [b.id, b.role.value]
            fams["in_flight"].add_metric(lv, b.load.in_flight)
            fams["peer_in_flight"].add_metric(lv, b.load.peer_in_flight)
            fams["pending"].add_metric(lv, b.load.pending_prefill_tokens)
            fams["decodes"].add_metric(lv, b.load.running_decodes)
            fams["healthy"].add_metric(lv, 1.0 if b.healthy else 0.0)
            fams["routable"].add_metric(lv, 1.0 if b.routable(now, self.fleet.stale_after) else 0.0)
            fams["ejected"].add_metric(lv, 1.0 if now < b.ejected_until else 0.0)
            if b.snapshot is not None:
                fams["age"].add_metric(lv, b.snapshot.age(now))
        yield from fams.values()
