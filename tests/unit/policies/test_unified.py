"""The hybrid "unified" policy: the affinity gate to the backend holding the session's longest
cached prefix (cache_ratio > 0.5, not overloaded), else LMetric under the hard ceiling; the
rendezvous home where `session_home` asks for it."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.kv_events import BlockStored
from fleet.types import Backend
from policies.registry import RoutingConfigError, build_policy, build_routing
from policies.rendezvous import home, ranked
from policies.scheduler import Scheduler
from tests.unit.policies.builders import backend, ctx, text_blocks


def session_homed_on(target: Backend, pool: list[Backend]) -> str:
    """The first of s0, s1, ... whose rendezvous home in `pool` is `target`."""
    return next(s for s in (f"s{i}" for i in range(1000)) if home(s, pool) is target)


def unified_stats(policy: Any) -> dict[str, int]:
    result: dict[str, int] = policy.stats()["unified"]
    return result


def owner_rule(params: dict[str, Any] | None = None) -> Any:
    """The unified policy with the owner rule alone (what `auto` picks with KV events)."""
    return build_policy("unified", {"session_home": "never", **(params or {})})


def with_owner(params: dict[str, Any] | None = None) -> tuple[Any, str, Backend, list[Backend]]:
    """A unified policy and a session whose first turn (8 blocks) went to `owner`, which is not
    the session's rendezvous home."""
    policy = owner_rule(params)
    bs = [backend("owner"), *(backend(f"o{i}") for i in range(3))]
    sid = session_homed_on(bs[1], bs)
    policy.pick(ctx(text_blocks(8), session=sid), [bs[0]], 0.0)  # the only candidate then
    return policy, sid, bs[0], bs


def test_a_session_cached_nowhere_is_placed_by_lmetric() -> None:
    policy = owner_rule()
    bs = [backend("a", in_flight=2), backend("b", in_flight=1), backend("c", in_flight=1)]
    sid = session_homed_on(bs[0], bs)  # the busiest, though not overloaded: 2 <= 4/3 x 2
    d = policy.pick(ctx(text_blocks(8), session=sid), bs, 0.0)
    assert d.target is not bs[0] and d.reason == "unified: lmetric"
    assert unified_stats(policy)["cold_sessions"] == 1


@pytest.mark.parametrize(
    ("case", "prompt_blocks", "owner_in_flight", "others_in_flight", "expected"),
    [
        # cache_ratio = 8 cached / 10 blocks = 0.8 > 0.5; owner load 3 <= avg 1.5 x 2.0
        ("both gates pass -> affinity", 10, 3, [1, 1, 1], "owner"),
        # 8/16 = 0.5 is not > 0.5: LMetric, which here prefers an idle backend
        ("cache gate fails -> lmetric", 16, 1, [0, 0, 0], "other"),
        # owner 7 > avg (7+1+1+1)/4 x 2 = 5: overloaded
        ("load gate fails -> lmetric", 10, 7, [1, 1, 1], "other"),
    ],
)
def test_affinity_gate(
    case: str, prompt_blocks: int, owner_in_flight: int, others_in_flight: list[int], expected: str
) -> None:
    policy, sid, owner, bs = with_owner()
    owner.load.in_flight = owner_in_flight
    for b, n in zip(bs[1:], others_in_flight, strict=True):
        b.load.in_flight = n
    d = policy.pick(ctx(text_blocks(prompt_blocks), session=sid, debug=True), bs, 0.0)
    got = "owner" if d.target is owner else "other"
    assert got == expected, (case, d.reason, d.scores)
    assert d.scores["owner"]["owner"] == 1.0
    assert d.scores["owner"]["cache_ratio"] == pytest.approx(8 / prompt_blocks)


def test_affinity_beats_a_lower_lmetric_score() -> None:
    policy, sid, owner, bs = with_owner()
    owner.load.in_flight, owner.load.pending_prefill_tokens = 2, 3000
    for b in bs[1:]:
        b.load.in_flight = 2
    d = policy.pick(ctx(text_blocks(10), session=sid), bs, 0.0)
    assert d.target is owner and d.reason == "unified: affinity"
    assert build_policy("lmetric").pick(ctx(text_blocks(10)), bs, 0.0).target is not owner
    assert unified_stats(policy)["affinity_hits"] == 1


def test_a_failed_gate_leaves_lmetrics_tie_breakers_to_prefer_the_cache() -> None:
    # The owner is overloaded; among the idle rest (every product 0) the one holding part of
    # the prompt wins the uncached-tokens tie-breaker, whatever the rotation.
    for rotation in range(3):
        policy, sid, owner, bs = with_owner()
        for _ in range(rotation):
            policy.pick(ctx(text_blocks(1, tag="z")), bs, 0.0)  # turns the rotation
        policy.pick(ctx(text_blocks(4)), [bs[3]], 0.0)  # o2 holds 4 of the blocks
        owner.load.in_flight = 10
        d = policy.pick(ctx(text_blocks(10), session=sid), bs, 0.0)
        assert d.target is bs[3] and d.reason == "unified: lmetric"
        assert unified_stats(policy)["gate_load_failures"] == 1
        # o2 now holds the longer prefix: the next turn's owner.
        d = policy.pick(ctx(text_blocks(11), session=sid), bs, 0.0)
        assert d.target is bs[3] and d.reason == "unified: affinity"


def test_a_turn_sent_elsewhere_is_followed_by_the_next_to_the_longer_prefix() -> None:
    # Turns 1-2 on the owner; the owner leaves the candidates (drained) for turn 3, which
    # lands elsewhere; back for turn 4, which follows turn 3's longer prefix and not the
    # session's rendezvous home or its first engine.
    policy, sid, owner, bs = with_owner()
    assert policy.pick(ctx(text_blocks(10), session=sid), bs, 0.0).target is owner
    rest = bs[1:]
    away = policy.pick(ctx(text_blocks(12), session=sid), rest, 0.0).target
    assert away is not owner
    d = policy.pick(ctx(text_blocks(14), session=sid, debug=True), bs, 0.0)
    assert d.target is away and d.reason == "unified: affinity"
    assert d.scores[away.id]["cache_ratio"] == pytest.approx(12 / 14)


def test_when_cold_a_session_goes_to_its_home_unless_overloaded() -> None:
    policy = build_policy("unified", {"session_home": "when_cold"})
    bs = [backend(f"b{i}") for i in range(4)]
    sid = "s"
    first = ranked(sid, bs)[0]
    d = policy.pick(ctx(text_blocks(8), session=sid, debug=True), bs, 0.0)
    assert d.target is first and d.reason == "unified: session home"
    assert d.scores[first.id]["home"] == 1.0
    # Warm elsewhere: the owner, not the home.
    other = next(b for b in bs if b is not first)
    policy.pick(ctx(text_blocks(12), session=sid), [other], 0.0)
    assert policy.pick(ctx(text_blocks(14), session=sid), bs, 0.0).target is other
    # Cold and the home overloaded: LMetric.
    first.load.in_flight = 9  # avg 9/4 x 2 = 4.5 < 9
    t = session_homed_on(first, bs)
    d = policy.pick(ctx(text_blocks(8, tag="new"), session=t), bs, 0.0)
    assert d.reason == "unified: lmetric" and d.target is not first
    stats = unified_stats(policy)  # the placement on `other` alone was a home placement too
    placed = (stats["home_placements"], stats["affinity_hits"], stats["gate_load_failures"])
    assert placed == (2, 1, 1)


def test_always_is_the_earlier_rule_home_unless_overloaded_whatever_holds_the_cache() -> None:
    policy, sid, owner, bs = with_owner({"session_home": "always"})
    d = policy.pick(ctx(text_blocks(10), session=sid), bs, 0.0)
    assert d.target is home(sid, bs) is not owner and d.reason == "unified: session home"
    home(sid, bs).load.in_flight = 12  # avg 3 x 2 = 6 < 12
    assert policy.pick(ctx(text_blocks(12), session=sid), bs, 0.0).target is not home(sid, bs)
    assert unified_stats(policy)["gate_load_failures"] == 1


TOKENS = list(range(1000, 1032))  # 8 full blocks of 4 tokens


def announced(policy: Scheduler, backend_id: str, blocks: int) -> None:
    """`backend_id`'s engine published the first `blocks` blocks of TOKENS."""
    index = policy.services.precise_index
    assert index is not None
    index.reset(backend_id, 0.0, complete=True)
    hashes = [f"{backend_id}-{i}".encode() for i in range(blocks)]
    index.apply(backend_id, [BlockStored(hashes, None, TOKENS[: blocks * 4], 4)], 0.0)


def test_processes_following_the_same_events_agree_whatever_each_routed() -> None:
    # One policy per worker or replica: each has sent different prompts (its own approximate
    # index) but follows the same engines' events, so each picks the same owner.
    bs = [backend(f"b{i}") for i in range(4)]
    workers = [build_routing({"policy": "unified", "precise_prefix": {}}) for _ in range(2)]  # auto
    for k, policy in enumerate(workers):
        policy.pick(ctx(text_blocks(8), session="s"), [bs[k]], 0.0)  # different histories
        for i, blocks in enumerate((2, 5, 7, 0)):
            announced(policy, f"b{i}", blocks)
    picks = []
    for policy in workers:
        c = ctx(text_blocks(8), session="s", debug=True)
        c.prompt_token_ids, c.prompt_tokens = TOKENS, len(TOKENS)
        picks.append(policy.pick(c, bs, 0.0))
    assert [d.target for d in picks] == [bs[2], bs[2]]
    assert [d.scores["b2"]["cache_ratio"] for d in picks] == [7 / 8, 7 / 8]


@pytest.mark.parametrize("mode", ["auto", "never", "when_cold", "always"])
def test_requests_without_a_session_use_lmetric(mode: str) -> None:
    policy = build_policy("unified", {"session_home": mode})
    bs = [backend("a", in_flight=3), backend("b", in_flight=1)]
    d = policy.pick(ctx(text_blocks(4)), bs, 0.0)
    assert d.target is bs[1] and d.reason == "unified: lmetric"
    assert sum(unified_stats(policy).values()) == 0


def test_auto_follows_the_owner_with_kv_events_and_the_home_without() -> None:
    bs = [backend(f"b{i}") for i in range(4)]
    sid = session_homed_on(bs[0], bs)
    approximate = build_policy("unified")
    approximate.pick(ctx(text_blocks(8), session=sid), [bs[1]], 0.0)  # cached on b1 only
    d = approximate.pick(ctx(text_blocks(10), session=sid), bs, 0.0)
    assert d.target is bs[0] and d.reason == "unified: session home"
    with_events = build_routing({"policy": "unified", "precise_prefix": {}})
    announced(with_events, "b1", 7)
    c = ctx(text_blocks(8), session=sid)
    c.prompt_token_ids, c.prompt_tokens = TOKENS, len(TOKENS)
    d = with_events.pick(c, bs, 0.0)
    assert d.target is bs[1] and d.reason == "unified: affinity"


def test_an_unknown_session_home_is_refused() -> None:
    with pytest.raises(RoutingConfigError, match="session_home"):
        build_policy("unified", {"session_home": "sometimes"})


@pytest.mark.parametrize(
    ("form", "prompt_blocks", "ceiling", "breaks"),
    [
        # The usual case: the request has at least one uncached block, so the owner's
        # P_tokens x BS > 0 while idle backends score 0: LMetric leaves the owner, with or
        # without the ceiling.
        ("one uncached block, no ceiling", 9, None, True),
        ("one uncached block, with the ceiling", 9, 2.0, True),
        # The open edge case: cache_ratio = 1.0. Without a ceiling the owner's product is 0
        # and it wins the uncached-tokens tie-breaker: re-elected despite overload
        # (gate-then-LMetric's behaviour, kept reachable with ceiling_factor null). The hard
        # ceiling settles it.
        ("fully cached, no ceiling re-elects the owner", 8, None, False),
        ("fully cached, the hard ceiling breaks affinity", 8, 2.0, True),
    ],
)
def test_hybrid_high_cache_breaks_on_overload(
    form: str, prompt_blocks: int, ceiling: float | None, breaks: bool
) -> None:
    policy, sid, owner, bs = with_owner({"ceiling_factor": ceiling})
    owner.load.in_flight = 12  # avg (12 + 0 + 0 + 0) / 4 = 3; 12 > 3 x 2.0: overloaded
    d = policy.pick(ctx(text_blocks(prompt_blocks), session=sid, debug=True), bs, 0.0)
    assert (d.target is not owner) == breaks, (form, d.reason, d.scores)
    if breaks:
        assert "lmetric" in d.reason


def test_ceiling_is_soft_when_everyone_is_over_it() -> None:
    policy = owner_rule()
    bs = [backend("a", in_flight=5), backend("b", in_flight=5)]
    assert policy.pick(ctx(text_blocks(2)), bs, 0.0).target.id in {"a", "b"}
