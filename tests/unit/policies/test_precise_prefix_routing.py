"""Routing by the engines' own KV-cache events: the precise scorer scores what a backend
really holds, falls back to the approximate index per backend, and LMetric's uncached-token
figure comes from the precise index where it stands for a backend."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.kv_events import BlockStored
from policies.policy import RequestContext
from policies.registry import RoutingConfigError, build_routing
from policies.scheduler import Scheduler
from tests.unit.policies.builders import backend, ctx, text_blocks

BS = 4
TOKENS = list(range(1000, 1032))  # 8 full blocks of 4


def precise_policy(**extra: Any) -> Scheduler:
    return build_routing(
        {
            "plugins": [
                {"type": "precise-prefix-cache-scorer", "name": "precise"},
                {"type": "max-score-picker", "name": "max"},
            ],
            "profiles": [{"name": "p", "scorers": ["precise"], "picker": "max"}],
            **extra,
        }
    )


def holds(policy: Scheduler, backend_id: str, blocks: int, *, complete: bool = True) -> None:
    """`backend_id`'s engine announced the first `blocks` blocks of TOKENS."""
    index = policy.services.precise_index
    assert index is not None
    index.reset(backend_id, 0.0, complete=complete)
    hashes = [f"{backend_id}-{i}".encode() for i in range(blocks)]
    index.apply(backend_id, [BlockStored(hashes, None, TOKENS[: blocks * BS], BS)], 0.0)


def with_ids(c: RequestContext, ids: list[int] | None = TOKENS) -> RequestContext:
    c.prompt_token_ids = ids
    if ids is not None:
        c.prompt_tokens = len(ids)
    return c


def test_the_score_is_the_share_of_full_blocks_held_by_events() -> None:
    policy = precise_policy()
    a, b, c = backend("a"), backend("b"), backend("c")
    holds(policy, "a", 2)
    holds(policy, "b", 6)
    holds(policy, "c", 0)
    decision = policy.pick(with_ids(ctx("anything", debug=True)), [a, b, c], 0.0)
    assert decision.target is b
    scores = decision.scores
    assert scores["a"]["precise"] == pytest.approx(2 / 8)
    assert scores["b"]["precise"] == pytest.approx(6 / 8)
    assert (scores["c"]["from_events"], scores["c"]["precise"]) == (1.0, 0.0)
    # What the proxy charges the chosen backend: only what it does not hold.
    assert decision.prefill_tokens == 32 - 24


def test_a_backend_without_events_is_scored_by_the_approximate_index() -> None:
    policy = precise_policy()
    a, b = backend("a"), backend("b")
    text = text_blocks(4)
    policy.pick(with_ids(ctx(text), None), [b], 0.0)  # b has taken this text: approximate
    holds(policy, "a", 1)
    decision = policy.pick(with_ids(ctx(text + text_blocks(4, "y"), debug=True)), [a, b], 0.0)
    assert decision.scores["a"]["precise"] == pytest.approx(1 / 8)
    assert decision.scores["b"]["precise"] == pytest.approx(4 / 8)  # b: no events, 4 of 8
    assert decision.target is b


def test_a_backend_being_rebuilt_falls_back_until_its_warmup_ends() -> None:
    policy = precise_policy(precise_prefix={"warmup_s": 10})
    a, b = backend("a"), backend("b")
    text = text_blocks(2)
    policy.pick(with_ids(ctx(text), None), [a], 0.0)  # a has taken the text: approximate
    holds(policy, "a", 0, complete=False)  # a's events were lost: its index starts over
    holds(policy, "b", 1)
    early = policy.pick(with_ids(ctx(text, debug=True)), [a, b], 5.0)
    assert (early.scores["a"]["from_events"], early.scores["a"]["precise"]) == (0.0, 1.0)
    assert early.target is a
    late = policy.pick(with_ids(ctx(text, debug=True)), [a, b], 10.0)
    assert (late.scores["a"]["from_events"], late.scores["a"]["precise"]) == (1.0, 0.0)
    assert late.target is b


def test_without_token_ids_every_backend_falls_back() -> None:
    policy = precise_policy()
    a, b = backend("a"), backend("b")
    holds(policy, "b", 8)
    text = text_blocks(3)
    policy.pick(with_ids(ctx(text), None), [a], 0.0)
    assert policy.pick(with_ids(ctx(text), None), [a, b], 0.0).target is a


def test_lmetric_counts_uncached_tokens_by_the_events_when_configured() -> None:
    plain = build_routing({"policy": "lmetric"})
    assert plain.services.precise_index is None  # nothing tokenizes for it
    policy = build_routing({"policy": "lmetric", "precise_prefix": {}})
    a, b = backend("a", in_flight=1), backend("b", in_flight=1)
    holds(policy, "b", 8)
    decision = policy.pick(with_ids(ctx("text", debug=True)), [a, b], 0.0)
    assert decision.target is b
    assert decision.scores["b"]["uncached_tokens"] == 0
    assert decision.scores["a"]["uncached_tokens"] == 32


def test_unknown_precise_settings_are_refused() -> None:
    with pytest.raises(RoutingConfigError, match="precise_prefix"):
        precise_policy(precise_prefix={"max_blocks": 5})
