"""Each scorer, table-driven: raw backend state in, [0, 1] scores out (higher is better)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.types import EngineMetrics
from policies.framework import RoutingServices, SchedulingRequest
from policies.registry import build_routing, plugin_types
from policies.rendezvous import home, ranked
from policies.scorers.load import (
    KvCacheUtilizationScorer,
    QueueDepthScorer,
    RunningRequestsScorer,
    TokenLoadScorer,
)
from policies.scorers.normalize import inverse_min_max
from tests.unit.policies.builders import backend, ctx, text_blocks


def req() -> SchedulingRequest:
    return SchedulingRequest(ctx("x"), 0.0, RoutingServices(64, 100))


@pytest.mark.parametrize(
    ("values", "expected"),
    [([0, 5, 10], [1.0, 0.5, 0.0]), ([3, 3], [1.0, 1.0]), ([7], [1.0]), ([2, 0], [0.0, 1.0])],
)
def test_inverse_min_max(values: list[float], expected: list[float]) -> None:
    assert inverse_min_max(values) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("scorer", "backends", "expected"),
    [
        # queue: scraped waiting, or our dispatched-but-no-first-token count, the larger
        (
            QueueDepthScorer(),
            [
                dict(scraped=EngineMetrics(waiting=0)),
                dict(scraped=EngineMetrics(waiting=4)),
                dict(scraped=EngineMetrics(waiting=8)),
            ],
            [1.0, 0.5, 0.0],
        ),
        (
            QueueDepthScorer(),
            [dict(in_flight=6, decoding=2), dict(in_flight=2, decoding=2)],
            [0.0, 1.0],
        ),
        # kv: 1 - usage; an unscraped backend counts as empty
        (
            KvCacheUtilizationScorer(),
            [
                dict(scraped=EngineMetrics(kv_usage=0.2)),
                dict(scraped=EngineMetrics(kv_usage=0.9)),
                {},
            ],
            [0.8, 0.1, 1.0],
        ),
        # running: scraped running or our decoding count
        (
            RunningRequestsScorer(),
            [dict(decoding=3), dict(scraped=EngineMetrics(running=1)), dict(decoding=1)],
            [0.0, 1.0, 1.0],
        ),
        # tokens: pending prefill + KV tokens in use when the cache size is published
        (
            TokenLoadScorer(),
            [
                dict(pending=1000),
                dict(scraped=EngineMetrics(kv_usage=0.5, block_size=16, num_gpu_blocks=250)),
                dict(pending=0),
            ],
            [0.5, 0.0, 1.0],
        ),
    ],
)
def test_load_scorers(scorer: Any, backends: list[dict[str, Any]], expected: list[float]) -> None:
    candidates = [backend(f"b{i}", **kw) for i, kw in enumerate(backends)]
    assert scorer.score(req(), candidates) == pytest.approx(expected)


def test_every_scorer_stays_in_unit_interval() -> None:
    candidates = [
        backend(
            "a",
            in_flight=9,
            pending=5000,
            decoding=3,
            scraped=EngineMetrics(
                running=50, waiting=40, kv_usage=1.0, block_size=16, num_gpu_blocks=10
            ),
        ),
        backend("b"),
    ]
    services = RoutingServices(64, 100)
    r = SchedulingRequest(ctx(text_blocks(4), session="s"), 0.0, services)
    for type_name, spec in plugin_types().items():
        if spec.kind != "scorer":
            continue
        scorer: Any = spec.factory(spec.params.model_validate({}), services, type_name)
        for s in scorer.score(r, candidates):
            assert 0.0 <= s <= 1.0, type_name


def one_scorer_policy(scorer_type: str, **params: Any) -> Any:
    return build_routing(
        {
            "plugins": [
                {"type": scorer_type, "name": "s", "params": params},
                {"type": "max-score-picker", "name": "max", "params": {"seed": 1}},
            ],
            "profiles": [{"name": "p", "scorers": [{"plugin": "s", "weight": 1}], "picker": "max"}],
        }
    )


def test_prefix_scorer_is_matched_share_of_blocks() -> None:
    policy = one_scorer_policy("prefix-cache-scorer")
    a, b = backend("a"), backend("b")
    policy.pick(ctx(text_blocks(4)), [a], 0.0)  # a now holds 4 blocks
    decision = policy.pick(ctx(text_blocks(8), debug=True), [a, b], 0.0)
    assert decision.target is a
    assert decision.scores["a"]["s"] == pytest.approx(0.5)
    assert decision.scores["b"]["s"] == 0.0


def test_session_affinity_scores_the_sessions_rendezvous_home() -> None:
    policy = one_scorer_policy("session-affinity-scorer")
    fleet4 = [backend(f"b{i}") for i in range(4)]
    for sid in ("alice", "bob", "carol"):
        d = policy.pick(ctx(session=sid, debug=True), fleet4, 0.0)
        assert d.target is home(sid, fleet4)
        assert sorted(v["s"] for v in d.scores.values()) == [0.0, 0.0, 0.0, 1.0]
        # From the first request on, in any process: another policy scores the same backend.
        other = one_scorer_policy("session-affinity-scorer")
        assert other.pick(ctx(session=sid), fleet4[::-1], 0.0).target is d.target
    # Its home gone, the next in its order scores 1.
    first, second = ranked("alice", fleet4)[:2]
    rest = [b for b in fleet4 if b is not first]
    assert policy.pick(ctx(session="alice"), rest, 0.0).target is second
    # No session: all zero.
    d = policy.pick(ctx(debug=True), fleet4, 0.0)
    assert all(v["s"] == 0.0 for v in d.scores.values())


def test_no_hit_lru_spreads_cold_requests_and_ignores_warm_ones() -> None:
    policy = one_scorer_policy("no-hit-lru-scorer")
    fleet3 = [backend(f"b{i}") for i in range(3)]
    cold = [policy.pick(ctx(text_blocks(2, tag)), fleet3, 0.0).target.id for tag in "abc"]
    assert sorted(cold) == ["b0", "b1", "b2"]  # never-used backends first
    # The fourth cold request goes to the least recently used one.
    assert policy.pick(ctx(text_blocks(2, "d")), fleet3, 0.0).target.id == cold[0]
    # A warm request (prefix known somewhere) gets 0.5 everywhere.
    d = policy.pick(ctx(text_blocks(2, "a"), debug=True), fleet3, 0.0)
    assert all(v["s"] == 0.5 for v in d.scores.values())


@pytest.mark.parametrize(("lru_size", "expected"), [(None, [0.75, 0.5, 0.25]), (1, [1, 1, 0.5])])
def test_no_hit_lru_size_bounds_the_backends_remembered(
    lru_size: int | None, expected: list[float]
) -> None:
    policy = one_scorer_policy("no-hit-lru-scorer", lru_size=lru_size)
    fleet3 = [backend(f"b{i}") for i in range(3)]
    cold = [policy.pick(ctx(text_blocks(2, tag)), fleet3, 0.0).target.id for tag in "abc"]
    d = policy.pick(ctx(text_blocks(2, "d"), debug=True), fleet3, 0.0)
    # least recently used first; with room for one, only the last is remembered
    assert [d.scores[b]["s"] for b in cold] == pytest.approx(expected)
