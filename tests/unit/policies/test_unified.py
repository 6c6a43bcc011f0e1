"""The hybrid "unified" policy: the affinity gate to the session's rendezvous home, else
LMetric; plus the hard ceiling."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.types import Backend
from policies.registry import build_policy
from policies.rendezvous import home, ranked
from tests.unit.policies.builders import backend, ctx, text_blocks


def session_homed_on(target: Backend, pool: list[Backend]) -> str:
    """The first of s0, s1, ... whose rendezvous home in `pool` is `target`."""
    return next(s for s in (f"s{i}" for i in range(1000)) if home(s, pool) is target)


def unified_stats(policy: Any) -> dict[str, int]:
    result: dict[str, int] = policy.stats()["unified"]
    return result


def with_home(params: dict[str, Any] | None = None) -> tuple[Any, str, Backend, list[Backend]]:
    """A unified policy and a session whose home `home` holds 8 blocks of its text."""
    policy = build_policy("unified", params)
    bs = [backend("home"), *(backend(f"o{i}") for i in range(3))]
    sid = session_homed_on(bs[0], bs)
    policy.pick(ctx(text_blocks(8), session=sid), bs, 0.0)  # cached nowhere: it goes home
    return policy, sid, bs[0], bs


def test_a_new_session_goes_home_even_where_lmetric_would_not() -> None:
    policy = build_policy("unified")
    bs = [backend("a", in_flight=2), backend("b", in_flight=1), backend("c", in_flight=1)]
    sid = session_homed_on(bs[0], bs)  # the busiest, though not overloaded: 2 <= 4/3 x 2
    d = policy.pick(ctx(text_blocks(8), session=sid), bs, 0.0)
    assert d.target is bs[0] and d.reason == "unified: affinity, home cold"
    assert build_policy("lmetric").pick(ctx(text_blocks(8)), bs, 0.0).target is not bs[0]
    assert unified_stats(policy)["cold_homes"] == 1


@pytest.mark.parametrize(
    ("case", "prompt_blocks", "home_in_flight", "others_in_flight", "expected"),
    [
        # cache_ratio = 8 cached / 10 blocks = 0.8 > 0.5; home load 3 <= avg 1.5 x 2.0
        ("both gates pass -> affinity", 10, 3, [1, 1, 1], "home"),
        # 8/16 = 0.5 is not > 0.5: a cold home, still home
        ("cold home", 16, 1, [1, 1, 1], "home"),
        # home 7 > avg (7+1+1+1)/4 x 2 = 5: overloaded
        ("gate 2 fails -> lmetric", 10, 7, [1, 1, 1], "other"),
    ],
)
def test_affinity_gate(
    case: str, prompt_blocks: int, home_in_flight: int, others_in_flight: list[int], expected: str
) -> None:
    policy, sid, home_b, bs = with_home()
    home_b.load.in_flight = home_in_flight
    for b, n in zip(bs[1:], others_in_flight, strict=True):
        b.load.in_flight = n
    d = policy.pick(ctx(text_blocks(prompt_blocks), session=sid, debug=True), bs, 0.0)
    got = "home" if d.target is home_b else "other"
    assert got == expected, (case, d.reason, d.scores)
    assert d.scores["home"]["home"] == 1.0


def test_a_prompt_cached_elsewhere_still_goes_home() -> None:
    # The home holds 8 of 16 blocks (0.5); o1 was sent all 16 by a request without a session.
    # Passing over a home for lacking the cache would keep it from ever getting it.
    policy, sid, home_b, bs = with_home()
    policy.pick(ctx(text_blocks(16)), [bs[2]], 0.0)
    d = policy.pick(ctx(text_blocks(16), session=sid), bs, 0.0)
    assert d.target is home_b and d.reason == "unified: affinity, home cold"
    assert unified_stats(policy)["cold_homes"] == 2


def test_affinity_beats_a_lower_lmetric_score() -> None:
    # The gate routes home even where LMetric alone would go elsewhere.
    policy, sid, home_b, bs = with_home()
    home_b.load.in_flight, home_b.load.pending_prefill_tokens = 2, 3000
    for b in bs[1:]:
        b.load.in_flight = 2
    d = policy.pick(ctx(text_blocks(10), session=sid, debug=True), bs, 0.0)
    assert d.target is home_b and d.reason == "unified: affinity"
    assert d.scores["home"]["cache_ratio"] == pytest.approx(0.8)
    lmetric = build_policy("lmetric")
    assert lmetric.pick(ctx(text_blocks(10)), bs, 0.0).target is not home_b


def test_turns_sent_away_by_overload_are_followed_home_once_the_home_recovers() -> None:
    policy, sid, home_b, bs = with_home()
    home_b.load.in_flight = 12  # avg 3 x 2.0 = 6 < 12: overloaded
    away = policy.pick(ctx(text_blocks(10), session=sid), bs, 0.0).target
    assert away is not home_b
    # Still overloaded: LMetric finds the blocks the last turn left on `away`.
    for turn in (12, 16, 20):
        assert policy.pick(ctx(text_blocks(turn), session=sid), bs, 0.0).target is away
    # Recovered: home, though it holds 8 of the next turn's 24 blocks and `away` holds 20.
    home_b.load.in_flight = 0
    d = policy.pick(ctx(text_blocks(24), session=sid), bs, 0.0)
    assert d.target is home_b and d.reason == "unified: affinity, home cold"
    assert unified_stats(policy)["gate_load_failures"] == 4


def test_two_processes_with_different_histories_agree() -> None:
    # One policy per worker process: only the first saw the session's earlier turns. The home
    # is the busiest (not overloaded), so LMetric alone would send the turn elsewhere.
    first, sid, home_b, bs = with_home()
    first.pick(ctx(text_blocks(10), session=sid), bs, 0.0)
    home_b.load.in_flight = 2
    for b in bs[1:]:
        b.load.in_flight = 1
    second = build_policy("unified")
    a = first.pick(ctx(text_blocks(12), session=sid), bs, 0.0)
    b = second.pick(ctx(text_blocks(12), session=sid), bs, 0.0)
    assert a.target is b.target is home_b
    assert (a.reason, b.reason) == ("unified: affinity", "unified: affinity, home cold")
    b = second.pick(ctx(text_blocks(14), session=sid), bs, 0.0)  # now it knows
    assert b.target is home_b and b.reason == "unified: affinity"


def test_when_the_home_is_gone_the_next_ranked_backend_is_home() -> None:
    policy = build_policy("unified")
    bs = [backend(f"b{i}") for i in range(5)]
    for i in range(40):
        sid = f"s{i}"
        first, second = ranked(sid, bs)[:2]
        rest = [b for b in bs if b is not first]
        assert policy.pick(ctx(text_blocks(4, tag=sid), session=sid), rest, 0.0).target is second


def test_a_home_that_returns_gets_its_sessions_back() -> None:
    # Though the next-ranked backend holds the session's cache and the home holds none.
    policy = build_policy("unified")
    bs = [backend(f"b{i}") for i in range(5)]
    first, second = ranked("s", bs)[:2]
    away = [b for b in bs if b is not first]
    assert policy.pick(ctx(text_blocks(4), session="s"), away, 0.0).target is second
    assert policy.pick(ctx(text_blocks(5), session="s"), bs, 0.0).target is first


def test_requests_without_a_session_use_lmetric() -> None:
    policy = build_policy("unified")
    bs = [backend("a", in_flight=3), backend("b", in_flight=1)]
    d = policy.pick(ctx(text_blocks(4)), bs, 0.0)
    assert d.target is bs[1] and d.reason == "unified: lmetric"
    assert sum(unified_stats(policy).values()) == 0


@pytest.mark.parametrize(
    ("form", "prompt_blocks", "ceiling", "breaks"),
    [
        # The usual case: the request has at least one uncached block, so the home's
        # P_tokens x BS > 0 while idle backends score 0: LMetric leaves the home, with or
        # without the ceiling.
        ("one uncached block, no ceiling", 9, None, True),
        ("one uncached block, with the ceiling", 9, 2.0, True),
        # The open edge case: cache_ratio = 1.0. Without a ceiling the home's product is 0
        # and it wins the uncached-tokens tie-breaker: re-elected despite overload
        # (gate-then-LMetric's behaviour, kept reachable with ceiling_factor null). The hard
        # ceiling settles it.
        ("fully cached, no ceiling re-elects the home", 8, None, False),
        ("fully cached, the hard ceiling breaks affinity", 8, 2.0, True),
    ],
)
def test_hybrid_high_cache_breaks_on_overload(
    form: str, prompt_blocks: int, ceiling: float | None, breaks: bool
) -> None:
    policy, sid, home_b, bs = with_home({"ceiling_factor": ceiling})
    home_b.load.in_flight = 12  # avg (12 + 0 + 0 + 0) / 4 = 3; 12 > 3 x 2.0: overloaded
    d = policy.pick(ctx(text_blocks(prompt_blocks), session=sid, debug=True), bs, 0.0)
    assert (d.target is not home_b) == breaks, (form, d.reason, d.scores)
    if breaks:
        assert "lmetric" in d.reason


def test_ceiling_is_soft_when_everyone_is_over_it() -> None:
    policy = build_policy("unified")
    bs = [backend("a", in_flight=5), backend("b", in_flight=5)]
    assert policy.pick(ctx(text_blocks(2)), bs, 0.0).target.id in {"a", "b"}
