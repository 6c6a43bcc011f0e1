"""The rescheduler's Prometheus metrics, in the registry it is given: the proxy's own when it
runs inside `fleet-proxy serve`, a registry of its own when it runs standalone."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# Outcomes of one request's move, as the executor counts them.
OUTCOMES = ("ok", "failed", "not_movable", "finished", "timeout")


class ReschedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.cycles = Counter(
            "fleet_proxy_rescheduling_cycles",
            "Rescheduling cycles run (view, decide, execute).",
            registry=registry,
        )
        self.pairs = Counter(
            "fleet_proxy_rescheduling_pairs",
            "Source-target pairs the rescheduler decided, by policy.",
            ["policy"],
            registry=registry,
        )
        # A counter (exposed with Prometheus' _total suffix): migrations that failed (their
        # target included, when it failed and the request went back to its source) or did
        # not finish within rescheduling_migration_timeout.
        self.failed = Counter(
            "fleet_proxy_rescheduling_failed_count",
            "Rescheduler migrations that failed or timed out.",
            registry=registry,
        )
        self.migrations = Counter(
            "fleet_proxy_rescheduling_migrations",
            "Requests the rescheduler tried to move, by policy and outcome.",
            ["policy", "outcome"],
            registry=registry,
        )
        self.cycle_seconds = Histogram(
            "fleet_proxy_rescheduling_cycle_seconds",
            "Seconds one rescheduling cycle took, its migrations included.",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry,
        )

    def count_move(self, policy: str, outcome: str) -> None:
        self.migrations.labels(policy, outcome).inc()
        if outcome in ("failed", "returned", "timeout"):
            self.failed.inc()
