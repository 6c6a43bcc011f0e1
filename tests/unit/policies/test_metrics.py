"""EPP-named metrics on the registry the proxy passes in (never the global one)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleet.types import EngineMetrics
from policies.policy import NoCandidate
from policies.registry import build_policy, build_routing
from tests.unit.policies.builders import backend, ctx, text_blocks


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_scheduler_pool_and_prefix_metrics() -> None:
    policy = build_routing(
        {
            "plugins": [
                {"type": "prefix-cache-scorer", "name": "prefix"},
                {"type": "max-score-picker", "name": "max"},
            ],
            "profiles": [{"name": "p", "scorers": ["prefix"], "picker": "max"}],
        }
    )
    registry = CollectorRegistry()
    a = backend("a", in_flight=2, scraped=EngineMetrics(waiting=4, running=2, kv_usage=0.5))
    b = backend("b", scraped=EngineMetrics(waiting=0, running=0, kv_usage=0.1))
    policy.bind_metrics(registry, lambda: {"m": [a, b]})
    for _ in range(3):
        policy.pick(ctx(text_blocks(4)), [a, b], 0.0)
    with pytest.raises(NoCandidate):
        policy.pick(ctx("x"), [], 0.0)
    got = samples(registry)
    success = sum(
        v
        for (n, labels), v in got.items()
        if n == "inference_extension_scheduler_attempts_total" and ("status", "success") in labels
    )
    assert success == 3
    assert (
        got[
            (
                "inference_extension_scheduler_attempts_total",
                (
                    ("namespace", ""),
                    ("pod_name", ""),
                    ("port", ""),
                    ("status", "failure"),
                    ("target_model_name", "m"),
                ),
            )
        ]
        == 1
    )
    assert got[("inference_extension_scheduler_e2e_duration_seconds_count", ())] == 3
    # The pool is what the source gives at scrape time, not what the last pick was offered.
    assert got[("inference_pool_ready_pods", (("name", "m"),))] == 2
    assert got[("inference_extension_prefix_indexer_size", ())] == 4
    # The first pick found nothing cached, the next two the whole prompt on the chosen one.
    assert got[("inference_extension_prefix_indexer_hit_ratio_count", ())] == 3
    assert got[("inference_extension_prefix_indexer_hit_ratio_sum", ())] == 2.0
    plugin_points = {
        dict(labels)["extension_point"]
        for (n, labels), _ in got.items()
        if n == "inference_extension_plugin_duration_seconds_count"
    }
    assert plugin_points == {"scorer", "picker"}


def test_pool_gauges_average_over_the_pool_source() -> None:
    policy = build_policy("round_robin")
    registry = CollectorRegistry()
    a = backend("a", scraped=EngineMetrics(waiting=4, running=2, kv_usage=0.5))
    b = backend("b", in_flight=2, scraped=EngineMetrics(waiting=0, running=4, kv_usage=0.1))
    pools = {"m": [a, b]}
    policy.bind_metrics(registry, lambda: pools)
    policy.pick(ctx(), [b], 0.0)  # a retry, offered only b: the pool is still a and b
    got = samples(registry)
    pool = (("name", "m"),)
    assert got[("inference_pool_ready_pods", pool)] == 2
    assert got[("inference_pool_average_kv_cache_utilization", pool)] == 0.3
    assert got[("inference_pool_average_queue_size", pool)] == 3.0  # (4 + 2) / 2
    assert got[("inference_pool_average_running_requests", pool)] == 3.0
    assert got[("inference_pool_per_pod_queue_size", (("model_server_pod", "b"), *pool))] == 2
    pools["m"] = [b]  # the fleet lost a
    assert samples(registry)[("inference_pool_ready_pods", pool)] == 1
