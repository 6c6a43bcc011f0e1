"""The planner's Prometheus metrics, in the registry it is given: the proxy's own when the
planner runs inside `fleet-proxy serve`, one of its own under `fleet-proxy plan`.

`PlannerMetrics` is a `PlannerEvents`: the loop and the connector feed it as they go.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from planner.config import PlannerRole
from planner.decide import Decision, PlannerState
from planner.drain import DrainReport
from planner.observe import Sample

DRAIN_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.replicas = Gauge(
            "fleet_proxy_planner_replicas",
            "Workers per planned role, after the last decision's change.",
            ["role"],
            registry=registry,
        )
        self.desired = Gauge(
            "fleet_proxy_planner_desired_replicas",
            "Workers per planned role the last decision asked for.",
            ["role"],
            registry=registry,
        )
        self.load = Gauge(
            "fleet_proxy_planner_load",
            "The last metric pull: prefill queue per unit of prefill capacity (prefill), "
            "mean KV-cache utilisation (decode).",
            ["role"],
            registry=registry,
        )
        self.interval_load = Gauge(
            "fleet_proxy_planner_interval_load",
            "The same load, averaged over the interval the last decision judged.",
            ["role"],
            registry=registry,
        )
        self.decisions = Counter(
            "fleet_proxy_planner_decisions",
            "Due planner decisions, by role and the rule that decided.",
            ["role", "reason"],
            registry=registry,
        )
        self.drains = Counter(
            "fleet_proxy_planner_drains",
            "Worker drains by role and outcome (drained, drain_timeout).",
            ["role", "outcome"],
            registry=registry,
        )
        self.drain_seconds = Histogram(
            "fleet_proxy_planner_drain_duration_seconds",
            "Seconds from a worker's drain to its removal (or to the drain deadline).",
            buckets=DRAIN_BUCKETS,
            registry=registry,
        )
        self.drained_requests = Counter(
            "fleet_proxy_planner_drained_requests",
            "Requests on draining workers: moved by evacuation, finished in place, or left "
            "on a worker whose drain timed out.",
            ["how"],
            registry=registry,
        )
        self.change_errors = Counter(
            "fleet_proxy_planner_change_errors",
            "Replica changes that failed (a worker not healthy in time, a drain timeout).",
            registry=registry,
        )

    def on_sample(self, sample: Sample) -> None:
        for role, value in (
            (PlannerRole.PREFILL, sample.prefill_queue),
            (PlannerRole.DECODE, sample.decode_kv),
        ):
            if value is not None:
                self.load.labels(role.value).set(value)

    def on_decision(self, decision: Decision, state: PlannerState, errors: tuple[str, ...]) -> None:
        for r in decision.roles:
            role = r.role.value
            self.decisions.labels(role, r.reason.value).inc()
            self.replicas.labels(role).set(state.replicas(r.role))
            self.desired.labels(role).set(r.desired)
            if r.load is not None:
                self.interval_load.labels(role).set(r.load)
        if errors:
            self.change_errors.inc(len(errors))

    def on_drain(self, role: PlannerRole, report: DrainReport) -> None:
        self.drains.labels(role.value, report.outcome.value).inc()
        self.drain_seconds.observe(report.waited_s)
        for how, n in report.requests_by_fate().items():
            self.drained_requests.labels(how).inc(n)
