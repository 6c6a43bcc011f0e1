"""latency-scorer and slo-headroom-tier-filter on backends with scraped latency histograms."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from fleet.types import Backend, EngineMetrics, MetricsSnapshot
from policies import predicted
from policies.policy import RequestContext
from policies.registry import RoutingConfigError, build_policy, build_routing
from tests.unit.policies.builders import backend, ctx


def engine(prefill_time_s: float, itl_sum_s: float, **kw: float) -> EngineMetrics:
    """Four finished requests of 1000 computed tokens each, ten tokens decoded one a step."""
    return EngineMetrics(
        prefill_computed_sum=4000,
        prefill_computed_count=4,
        prefill_time_sum=prefill_time_s,
        prefill_time_count=4,
        itl_sum=itl_sum_s,
        itl_count=10,
        steps=10,
        generation_tokens=10,
        **kw,
    )


def two_engines() -> list[Backend]:
    # fast: 4000 prompt tokens/s, ITL 20 ms; slow: 1000 tokens/s, ITL 80 ms; both idle
    return [
        backend("fast", scraped=engine(1.0, 0.2)),
        backend("slow", scraped=engine(4.0, 0.8)),
    ]


def request(**headers: str) -> RequestContext:
    c = ctx("q" * 64, tokens=400, debug=True)
    c.headers = headers
    return c


def routing(*plugins: dict[str, Any], filters: list[str] | None = None) -> dict[str, Any]:
    scorers = [p["name"] for p in plugins if p["type"].endswith("scorer")]
    return {
        "plugins": [*plugins, {"type": "max-score-picker", "name": "best", "params": {"seed": 1}}],
        "profiles": [
            {"name": "default", "filters": filters or [], "scorers": scorers, "picker": "best"}
        ],
    }


LATENCY = {"type": "latency-scorer", "name": "lat"}
TIER = {"type": "slo-headroom-tier-filter", "name": "tier"}


def test_scores_headroom_against_the_slo() -> None:
    policy = build_routing(routing(LATENCY))
    d = policy.pick(request(**{"x-slo-ttft-ms": "200", "x-slo-tpot-ms": "50"}), two_engines(), 0)
    # fast: TTFT 400/4000 = 0.1 s (headroom 0.5), TPOT 20 ms (0.6): (0.5 + 0.6) / 2
    # slow: TTFT 0.4 s and TPOT 80 ms miss both: 0
    assert d.target.id == "fast"
    assert d.scores["fast"]["lat"] == pytest.approx(0.55)
    assert d.scores["slow"]["lat"] == 0.0
    assert d.scores["fast"]["lat.ttft_ms"] == pytest.approx(100.0)
    assert d.scores["slow"]["lat.tpot_ms"] == pytest.approx(80.0)


def test_without_an_slo_the_lower_prediction_wins() -> None:
    d = build_routing(routing(LATENCY)).pick(request(), two_engines(), 0)
    assert (d.scores["fast"]["lat"], d.scores["slow"]["lat"]) == (1.0, 0.0)


def test_a_queue_makes_the_fast_engine_slower_than_the_idle_slow_one() -> None:
    fleet = [
        backend("fast", scraped=engine(1.0, 0.2, waiting=4)),  # 4 x 1000 queued: TTFT 1.1 s
        backend("slow", scraped=engine(4.0, 0.8)),  # TTFT 0.4 s
    ]
    d = build_routing(routing(LATENCY)).pick(request(**{"x-slo-ttft-ms": "1000"}), fleet, 0)
    assert d.target.id == "slow"
    assert d.scores["fast"]["lat.ttft_ms"] == pytest.approx(1100.0)
    assert d.scores["slow"]["lat"] == pytest.approx(0.6)


def test_an_engine_without_traffic_is_predicted_like_its_peers() -> None:
    fleet = [*two_engines(), backend("new", scraped=EngineMetrics())]
    d = build_routing(routing(LATENCY)).pick(request(), fleet, 0)
    # median of 4000 and 1000 tokens/s is 2500: 400 / 2500 = 160 ms; ITL median 50 ms
    assert d.scores["new"]["lat.ttft_ms"] == pytest.approx(160.0)
    assert d.scores["new"]["lat.tpot_ms"] == pytest.approx(50.0)


def test_recent_interval_rates_come_from_the_previous_scrape() -> None:
    b = backend("b", scraped=engine(1.0, 0.2))
    assert b.snapshot is not None
    b.previous_snapshot = b.snapshot
    # the last interval: one request of 1000 computed tokens in 0.5 s: 2000 tokens/s, not the
    # 5000 / 1.5 of the engine's life
    later = replace(
        b.snapshot.metrics,
        prefill_computed_sum=5000,
        prefill_computed_count=5,
        prefill_time_sum=1.5,
        prefill_time_count=5,
    )
    b.snapshot = MetricsSnapshot(1.0, later)
    d = build_routing(routing(LATENCY)).pick(request(), [b], 0)
    assert d.scores["b"]["lat.ttft_ms"] == pytest.approx(200.0)


def test_tier_filter_keeps_the_engines_that_meet_the_slo() -> None:
    policy = build_routing(routing(LATENCY, TIER, filters=["tier"]))
    for _ in range(5):
        d = policy.pick(request(**{"x-slo-ttft-ms": "200"}), two_engines(), 0)
        assert d.target.id == "fast"
        assert "slow" not in d.scores  # filtered out before scoring
    d = policy.pick(request(**{"x-slo-ttft-ms": "500"}), two_engines(), 0)
    assert set(d.scores) == {"fast", "slow"}  # both meet 500 ms: both kept


def test_tier_filter_passes_everything_without_an_slo() -> None:
    policy = build_routing(routing(TIER, filters=["tier"]))
    seen = {policy.pick(request(), two_engines(), 0).target.id for _ in range(40)}
    assert seen == {"fast", "slow"}


def test_tier_filter_prefers_meeting_one_objective_to_none() -> None:
    fleet = [
        backend("both-miss", scraped=engine(4.0, 0.8)),  # 400 ms, 80 ms
        backend("one-miss", scraped=engine(4.0, 0.2)),  # 400 ms, 20 ms
    ]
    policy = build_routing(routing(LATENCY, TIER, filters=["tier"]))
    d = policy.pick(request(**{"x-slo-ttft-ms": "200", "x-slo-tpot-ms": "50"}), fleet, 0)
    assert d.target.id == "one-miss" and set(d.scores) == {"one-miss"}
    assert policy.stats()["tier"] == {"tier_1": 1, "explorations": 0}


def test_exploration_keeps_the_worse_tiers() -> None:
    tier = {**TIER, "params": {"explore_probability": 1.0, "seed": 3}}
    policy = build_routing(routing(LATENCY, tier, filters=["tier"]))
    d = policy.pick(request(**{"x-slo-ttft-ms": "200"}), two_engines(), 0)
    assert d.target.id == "slow"
    assert "explored tiers worse than 0" in d.reason


def test_filter_and_scorer_predict_once_per_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = predicted._predict_all

    def counting(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(predicted, "_predict_all", counting)
    policy = build_routing(routing(LATENCY, TIER, filters=["tier"]))
    policy.pick(request(**{"x-slo-ttft-ms": "500"}), two_engines(), 0)
    assert len(calls) == 1


def test_other_configurations_never_read_slo_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any) -> Any:
        raise AssertionError("SLO parsed without a latency-aware plugin")

    monkeypatch.setattr(predicted, "parse_slo", refuse)
    policy = build_policy("prefix_aware")
    policy.pick(request(**{"x-slo-ttft-ms": "200"}), two_engines(), 0)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"ttft_weight": 0, "tpot_weight": 0}, "ttft_weight \\+ tpot_weight must be positive"),
        ({"itl_batch_share": 2}, "itl_batch_share"),
        ({"headroom": "some"}, "headroom"),
    ],
)
def test_bad_scorer_params(params: dict[str, Any], message: str) -> None:
    with pytest.raises(RoutingConfigError, match=message):
        build_routing(routing({**LATENCY, "params": params}))
