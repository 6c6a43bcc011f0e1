"""LMetric: P_tokens x BS, lowest wins, with deterministic tie-breakers."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.types import EngineMetrics
from policies.loads import batch_size
from policies.registry import build_policy
from tests.unit.policies.builders import backend, ctx, text_blocks


@pytest.mark.parametrize(
    ("case", "backends", "expected"),
    [
        # The request: 100 tokens, nothing cached, so P = pending + 100 and BS = in flight.
        (
            "fewer pending tokens does not win alone",
            [dict(pending=200, in_flight=1), dict(pending=0, in_flight=2)],
            "b1",
        ),  # 300 vs 200
        (
            "a smaller batch does not win alone",
            [dict(pending=50, in_flight=4), dict(pending=400, in_flight=1)],
            "b1",
        ),  # 600 vs 500
        (
            "the product decides",
            [dict(pending=100, in_flight=3), dict(pending=900, in_flight=1)],
            "b0",
        ),  # 600 vs 1000
        (
            "BS reconciles with the scrape: the larger of ours and running+waiting",
            [dict(in_flight=1), dict(in_flight=0, scraped=EngineMetrics(running=3, waiting=2))],
            "b0",
        ),
    ],
)
def test_lowest_p_tokens_times_bs_wins(
    case: str, backends: list[dict[str, Any]], expected: str
) -> None:
    policy = build_policy("lmetric")
    bs = [backend(f"b{i}", **kw) for i, kw in enumerate(backends)]
    d = policy.pick(ctx("x" * 400, debug=True), bs, 0.0)  # 100 tokens, nothing cached
    products = {b: v["lmetric"] for b, v in d.scores.items()}
    assert d.target.id == expected, (case, products)
    assert products[expected] == min(products.values())


def test_cold_start_spreads_by_rotation() -> None:
    # BS = 0 everywhere makes every product 0; the round-robin counter breaks the tie.
    policy = build_policy("lmetric")
    bs = [backend(f"b{i}") for i in range(4)]
    assert [policy.pick(ctx(text_blocks(2, t)), bs, 0.0).target.id for t in "abcd"] == [
        "b0",
        "b1",
        "b2",
        "b3",
    ]


def test_secondary_key_prefers_the_cache_when_products_tie() -> None:
    policy = build_policy("lmetric")
    a, b = backend("a"), backend("b")
    policy.pick(ctx(text_blocks(4)), [b], 0.0)  # b holds the prefix now
    # Both idle: products 0 and 0; b has fewer uncached tokens. Rotation would pick a first.
    for _ in range(3):
        assert policy.pick(ctx(text_blocks(6)), [a, b], 0.0).target is b


def test_tertiary_key_prefers_fewer_requests() -> None:
    policy = build_policy("lmetric")
    a, b = backend("a"), backend("b")
    text = text_blocks(4)
    policy.pick(ctx(text), [a], 0.0)
    policy.pick(ctx(text), [b], 0.0)
    # Fully cached on both, nothing pending: P = 0, products 0, uncached 0; BS 3 vs 1.
    a.load.in_flight, b.load.in_flight = 3, 1
    d = policy.pick(ctx(text, debug=True), [a, b], 0.0)
    assert d.target is b
    assert d.scores["a"]["lmetric"] == d.scores["b"]["lmetric"] == 0.0


def test_implicit_soft_affinity_from_uncached_tokens() -> None:
    # Seed 002: later turns prefer the backend holding the prefix because their P_tokens are
    # smaller there, even with equal batch sizes.
    policy = build_policy("lmetric")
    a, b = backend("a", in_flight=2), backend("b", in_flight=2)
    policy.pick(ctx(text_blocks(16)), [a], 0.0)
    d = policy.pick(ctx(text_blocks(20), debug=True), [a, b], 0.0)
    assert d.target is a
    assert d.scores["a"]["uncached_tokens"] == 64 and d.scores["b"]["uncached_tokens"] == 320


def test_decision_tells_the_proxy_what_the_target_must_prefill() -> None:
    policy = build_policy("lmetric")
    a = backend("a")
    first = policy.pick(ctx(text_blocks(16)), [a], 0.0)
    assert first.prefill_tokens == 256  # nothing cached: the whole prompt
    again = policy.pick(ctx(text_blocks(20)), [a], 0.0)
    assert again.prefill_tokens == 64  # 16 of 20 blocks cached
    assert build_policy("round_robin").pick(ctx("x" * 40), [a], 0.0).prefill_tokens is None


def test_argmin_matches_the_lexicographic_key_on_random_fleets() -> None:
    import random

    from policies.framework import RoutingServices, SchedulingRequest
    from policies.pickers.lmetric import lmetric_argmin

    rng = random.Random(5)
    for _ in range(300):
        services = RoutingServices(64, 1000)
        index = services.use_prefix_index()
        n = rng.randint(1, 9)
        bs = [
            backend(
                f"b{i}", in_flight=rng.choice([0, 0, 1, 2, 5]), pending=rng.choice([0, 0, 64, 128])
            )
            for i in range(n)
        ]
        text = text_blocks(rng.randint(0, 6))
        for b in bs:
            if rng.random() < 0.4:
                index.record(b.id, index.hashes(text_blocks(rng.randint(0, 6)), "m"))
        req = SchedulingRequest(ctx(text), 0.0, services)
        start = rng.randrange(n)
        rotated = bs[start:] + bs[:start]

        def key(b: Any, req: SchedulingRequest = req) -> tuple[float, int, float]:
            u = req.uncached_tokens(b.id)
            return ((b.load.pending_prefill_tokens + u) * batch_size(b), u, batch_size(b))

        assert lmetric_argmin(req, bs, start) is min(rotated, key=key)
