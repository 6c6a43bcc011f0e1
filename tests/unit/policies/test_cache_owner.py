"""The hybrid's affinity owner: the candidate holding the longest cached prefix of the prompt,
read from hand-built indexes (the approximate one, the engines' events, both)."""

from __future__ import annotations

import pytest

from fleet.kv_events import BlockStored
from policies.framework import RoutingServices, SchedulingRequest
from policies.pickers.cache_owner import cache_owner
from policies.policy import RequestContext
from policies.rendezvous import ranked
from tests.unit.policies.builders import MODEL, backend, ctx, text_blocks

BS = 4
TOKENS = list(range(1000, 1032))  # 8 full blocks of 4


def request(c: RequestContext, services: RoutingServices) -> SchedulingRequest:
    return SchedulingRequest(ctx=c, now=0.0, services=services)


def services() -> RoutingServices:
    s = RoutingServices(chars_per_block=64, default_capacity_blocks=10_000)
    s.use_prefix_index()
    return s


def sent(s: RoutingServices, backend_id: str, text: str, session: str = "s") -> None:
    """This process routed `text` to `backend_id`: its approximate index says it holds it."""
    index = s.use_prefix_index()
    index.record(backend_id, index.hashes(text, MODEL, session))


def announced(s: RoutingServices, backend_id: str, blocks: int) -> None:
    """`backend_id`'s engine published the first `blocks` blocks of TOKENS."""
    index = s.use_precise_index()
    index.reset(backend_id, 0.0, complete=True)
    hashes = [f"{backend_id}-{i}".encode() for i in range(blocks)]
    index.apply(backend_id, [BlockStored(hashes, None, TOKENS[: blocks * BS], BS)], 0.0)


def with_ids(c: RequestContext) -> RequestContext:
    c.prompt_token_ids = TOKENS
    c.prompt_tokens = len(TOKENS)
    return c


def test_the_owner_holds_the_longest_prefix_and_its_share_is_the_ratio() -> None:
    s = services()
    a, b, c = backend("a"), backend("b"), backend("c")
    sent(s, "a", text_blocks(3))
    sent(s, "b", text_blocks(6))
    owner = cache_owner(request(ctx(text_blocks(8), session="s"), s), [a, b, c], "s")
    assert owner is not None
    assert owner.backend is b
    assert owner.ratio == pytest.approx(6 / 8)
    assert owner.cached_tokens == ctx(text_blocks(8)).prompt_tokens * 6 // 8


def test_nothing_cached_or_cached_only_off_the_candidates_has_no_owner() -> None:
    s = services()
    a, b = backend("a"), backend("b")
    assert cache_owner(request(ctx(text_blocks(4), session="s"), s), [a, b], "s") is None
    sent(s, "gone", text_blocks(4))
    assert cache_owner(request(ctx(text_blocks(4), session="s"), s), [a, b], "s") is None


def test_the_engines_events_outrank_this_processs_own_record() -> None:
    # This process sent the prompt to a, but a's engine says it holds one block and b's, that
    # it was never told about through this process, holds six.
    s = services()
    a, b = backend("a"), backend("b")
    text = text_blocks(8)
    sent(s, "a", text)
    announced(s, "a", 1)
    announced(s, "b", 6)
    owner = cache_owner(request(with_ids(ctx(text, session="s")), s), [a, b], "s")
    assert owner is not None and owner.backend is b
    assert owner.ratio == pytest.approx(24 / 32)


def test_a_backend_without_events_is_read_from_the_approximate_index() -> None:
    s = services()
    a, silent = backend("a"), backend("silent")
    text = text_blocks(8)
    sent(s, "silent", text)  # all 8 of the prompt's text blocks
    announced(s, "a", 6)
    owner = cache_owner(request(with_ids(ctx(text, session="s")), s), [a, silent], "s")
    assert owner is not None and owner.backend is silent and owner.ratio == 1.0


def test_equal_prefixes_go_to_the_less_loaded() -> None:
    s = services()
    busy, idle = backend("busy", in_flight=3), backend("idle", in_flight=1)
    for b in (busy, idle):
        sent(s, b.id, text_blocks(4))
    owner = cache_owner(request(ctx(text_blocks(8), session="s"), s), [busy, idle], "s")
    assert owner is not None and owner.backend is idle


@pytest.mark.parametrize("session", [f"s{i}" for i in range(8)])
def test_equal_prefixes_and_loads_go_by_the_sessions_rendezvous_order(session: str) -> None:
    s = services()
    bs = [backend(f"b{i}") for i in range(4)]
    holders = bs[1:]
    for b in holders:
        sent(s, b.id, text_blocks(4), session)
    want = ranked(session, holders)[0]
    for order in (bs, list(reversed(bs))):  # whatever the candidates' order
        req = request(ctx(text_blocks(8), session=session), s)
        owner = cache_owner(req, order, session)
        assert owner is not None and owner.backend is want
