"""vLLM's own KV-cache events, straight from the tier's engines (engines.py start --kv-events:
PUB and replay sockets bound on tcp://*:PORT) and decoded with msgspec alone
(tests/support/vllm_kv_wire.py), independently of the proxy's decoder.

A PUB socket drops what it publishes before a new subscriber's subscription has reached it,
so each subscriber here is first shown to be live: a probe request's stored block must reach
it. After that every batch arrives, in sequence order without gaps.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import zmq

from tests.real_vllm.tier import Engine, Tier, cache_config, engine_metric
from tests.support.polling import holds_within_blocking
from tests.support.vllm_kv_wire import (
    END_SEQ,
    Batch,
    CacheView,
    StoredBlock,
    decode_batch,
    stored_blocks,
)

pytestmark = pytest.mark.real_vllm

# A CPU engine decoding beside another one on 2 loaded cores answers slowly; these bound waits
# for what must come, they are not expected durations.
WAIT = 60.0


def unique_ids(n: int) -> list[int]:
    """Token ids no earlier request sent (a fresh random sequence), so none of them is cached."""
    rng = random.Random(uuid.uuid4().int)
    return [rng.randrange(100, 2000) for _ in range(n)]


def chunks(ids: list[int], size: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + size]) for i in range(0, len(ids) - size + 1, size)]


def complete(tier: Tier, engine: Engine, prompt: list[int], max_tokens: int = 2) -> None:
    body = {"model": tier.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=WAIT)
    assert r.status_code == 200, r.text


def stored(batches: list[Batch]) -> list[StoredBlock]:
    return [
        block
        for batch in batches
        for event in batch.events
        if event["type"] == "BlockStored"
        for block in stored_blocks(event)
    ]


class Subscriber:
    """A SUB socket on one engine's publisher; `batches` are those received since it went
    live, checked to be consecutive."""

    def __init__(self, ctx: zmq.Context[Any], tier: Tier, engine: Engine) -> None:
        assert engine.kv_events_endpoint and tier.kv_events_topic is not None
        self.tier, self.engine = tier, engine
        self.topic = tier.kv_events_topic.encode()
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sock.connect(engine.kv_events_endpoint)
        self.block = int(cache_config(engine.url)["block_size"])
        # What the events since going live say the engine holds.
        self.view = CacheView(whole_history=False)
        self.last_seq: int | None = None

    def _receive(self, timeout: float) -> Batch | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        batch = decode_batch(self.sock.recv_multipart())
        assert batch.topic == self.topic
        assert batch.data_parallel_rank == 0
        if self.last_seq is not None:
            assert batch.seq == self.last_seq + 1, f"a gap after seq {self.last_seq}: {batch.seq}"
        self.last_seq = batch.seq
        for event in batch.events:
            self.view.apply(event)
        return batch

    def until(self, done: Callable[[list[Batch]], bool], what: str) -> list[Batch]:
        """Batches until `done(batches)` holds; fails after WAIT seconds."""
        batches: list[Batch] = []
        deadline = time.monotonic() + WAIT
        while not done(batches):
            left = deadline - time.monotonic()
            batch = self._receive(left) if left > 0 else None
            if batch is None:
                pytest.fail(f"{self.engine.name}: no {what} within {WAIT:.0f} s; got {batches}")
            batches.append(batch)
        return batches

    def until_stored(self, blocks: list[tuple[int, ...]], what: str) -> list[Batch]:
        """Batches until blocks with exactly these token ids have been stored."""
        return self.until(
            lambda got: [b.token_ids for b in stored(got)][-len(blocks) :] == blocks, what
        )

    def go_live(self) -> None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            probe = unique_ids(self.block + 1)
            complete(self.tier, self.engine, probe, max_tokens=1)
            if not self.sock.poll(1000):
                # Published before the subscription took effect (a late batch is fine: the
                # next probe's block is then awaited behind it).
                continue
            self.last_seq = None  # count gaps from the first batch received on
            # Everything published after the probe reaches us now.
            self.until_stored(chunks(probe, self.block), "probe block")
            return
        pytest.fail(f"{self.engine.name}: the subscription never took effect within {WAIT} s")

    def marker(self) -> list[Batch]:
        """A request that stores one block of fresh tokens: the batches before its own are
        all that the engine published since the last ones read."""
        probe = unique_ids(self.block + 1)
        complete(self.tier, self.engine, probe, max_tokens=1)
        batches = self.until_stored(chunks(probe, self.block), "marker block")
        return batches[:-1]


@pytest.fixture
def subscribe(kv_events_tier: Tier) -> Iterator[Callable[[Engine], Subscriber]]:
    ctx: zmq.Context[Any] = zmq.Context()

    def make(engine: Engine) -> Subscriber:
        sub = Subscriber(ctx, kv_events_tier, engine)
        sub.go_live()
        return sub

    yield make
    ctx.destroy(linger=0)


def prefix_counters(engine: Engine) -> tuple[float, float]:
    return (
        engine_metric(engine.url, "vllm:prefix_cache_hits_total"),
        engine_metric(engine.url, "vllm:prefix_cache_queries_total"),
    )


def counters_after(engine: Engine, before: tuple[float, float], queried: int) -> tuple[int, int]:
    """(hits, queries) since `before`, once the engine has counted `queried` more queried
    tokens (its /metrics may lag the answer)."""
    now = before

    def counted() -> bool:
        nonlocal now
        now = prefix_counters(engine)
        return now[1] - before[1] >= queried

    assert holds_within_blocking(counted, WAIT, every=0.2), (
        f"queries stayed at {now[1] - before[1]}"
    )
    return int(now[0] - before[0]), int(now[1] - before[1])


def test_stored_blocks_are_the_prompt_blocks_and_a_repeat_hits_exactly_them(
    kv_events_tier: Tier, subscribe: Callable[[Engine], Subscriber]
) -> None:
    engine = kv_events_tier.engines[0]
    sub = subscribe(engine)
    size = sub.block
    prompt = unique_ids(5 * size + 10)
    blocks = chunks(prompt, size)
    assert len(blocks) == 5

    before = prefix_counters(engine)
    complete(kv_events_tier, engine, prompt)
    batches = sub.until_stored(blocks, "BlockStored for the prompt")
    # Only this request ran: what was stored is exactly the prompt's full blocks, in
    # block_size chunks (2 generated tokens fill no block), each the child of the one before.
    got = stored(batches)
    assert [b.token_ids for b in got] == blocks
    assert [b.parent for b in got] == [None, *(b.block_hash for b in got[:-1])]
    assert len({b.block_hash for b in got}) == 5
    assert all(
        e["block_size"] == size for b in batches for e in b.events if e["type"] == "BlockStored"
    )
    hits, queries = counters_after(engine, before, len(prompt))
    assert (hits, queries) == (0, len(prompt))

    # The events say the engine holds the 5 blocks; a repeat hits exactly those tokens and,
    # nothing being new, stores and removes none of them.
    expected = sub.view.expected_hit_tokens(prompt, size)
    assert expected == 5 * size
    before = prefix_counters(engine)
    complete(kv_events_tier, engine, prompt)
    assert counters_after(engine, before, len(prompt)) == (expected, len(prompt))
    between = sub.marker()
    ours = {b.block_hash for b in got}
    assert not [b for b in stored(between) if b.block_hash in ours]
    removed = {
        h
        for b in between
        for e in b.events
        if e["type"] == "BlockRemoved"
        for h in e["block_hashes"]
    }
    assert not removed & ours


def test_both_engines_key_the_same_tokens_with_the_same_hashes(
    kv_events_tier: Tier, subscribe: Callable[[Engine], Subscriber]
) -> None:
    """Block hashes depend on the tokens alone (sha256, no per-process seed): a router can
    match one engine's blocks against another's."""
    subs = [subscribe(engine) for engine in kv_events_tier.engines[:2]]
    size = subs[0].block
    prompt = unique_ids(3 * size + 5)
    keys = []
    for sub in subs:
        complete(kv_events_tier, sub.engine, prompt)
        got = stored(sub.until_stored(chunks(prompt, size), "BlockStored for the prompt"))
        keys.append([(b.parent, b.block_hash, b.token_ids) for b in got])
    assert keys[0] == keys[1]


def test_a_reset_is_announced_with_the_next_steps_batch(
    kv_events_tier: Tier, subscribe: Callable[[Engine], Subscriber]
) -> None:
    """POST /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1) queues AllBlocksCleared, but vLLM
    publishes only when a step runs: it heads the next request's batch, and no batch comes
    between. The same tokens are then stored again under the same hashes, with no hit."""
    engine = kv_events_tier.engines[0]
    sub = subscribe(engine)
    size = sub.block
    prompt = unique_ids(3 * size + 5)
    complete(kv_events_tier, engine, prompt)
    first = stored(sub.until_stored(chunks(prompt, size), "BlockStored for the prompt"))
    last_seq = sub.last_seq
    assert last_seq is not None

    def reset() -> bool:  # refused while a request still holds blocks
        r = httpx.post(f"{engine.url}/reset_prefix_cache", timeout=WAIT)
        assert r.status_code == 200, f"{r.status_code} {r.text} (needs VLLM_SERVER_DEV_MODE=1)"
        return bool(r.json()["success"])

    assert holds_within_blocking(reset, WAIT, every=0.5), "the prefix cache was never reset"
    before = prefix_counters(engine)
    complete(kv_events_tier, engine, prompt)
    batches = sub.until_stored(chunks(prompt, size), "BlockStored after the reset")
    assert batches[0].seq == last_seq + 1
    assert batches[0].events[0] == {"type": "AllBlocksCleared"}
    again = stored(batches)
    assert [(b.parent, b.block_hash, b.token_ids) for b in again] == [
        (b.parent, b.block_hash, b.token_ids) for b in first
    ]
    assert counters_after(engine, before, len(prompt)) == (0, len(prompt))


def test_replay_returns_the_published_batches_then_end(
    kv_events_tier: Tier, subscribe: Callable[[Engine], Subscriber]
) -> None:
    """The ROUTER replay socket answers a DEALER's [b"", seq] with every buffered batch from
    that seq on, byte for byte as published, then [b"", b"", -1, b""]."""
    engine = kv_events_tier.engines[0]
    assert engine.kv_events_replay_endpoint
    sub = subscribe(engine)
    prompt = unique_ids(2 * sub.block + 3)
    complete(kv_events_tier, engine, prompt, max_tokens=3 * sub.block // 2)
    batches = sub.until_stored(chunks(prompt, sub.block), "BlockStored for the prompt")
    batches += sub.marker()

    dealer = sub.sock.context.socket(zmq.DEALER)
    dealer.connect(engine.kv_events_replay_endpoint)

    def replay(start: int) -> list[list[bytes]]:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        replies = []
        while dealer.poll(int(WAIT * 1000)):
            replies.append(dealer.recv_multipart())
            if replies[-1][2:3] == [END_SEQ]:
                return replies
        pytest.fail(f"replay from {start}: no END marker within {WAIT} s after {replies}")

    replies = replay(batches[0].seq)
    assert replies[-1] == [b"", b"", END_SEQ, b""]
    assert [r[0] for r in replies[:-1]] == [b""] * (len(replies) - 1)
    published = [[b.topic, b.seq.to_bytes(8, "big"), b.payload] for b in batches]
    # The marker's own batch came after `batches`, and nothing else ran.
    assert [r[1:] for r in replies[:-2]] == published
    assert int.from_bytes(replies[-2][2], "big") == batches[-1].seq + 1
    assert replay(batches[-1].seq + 100) == [[b"", b"", END_SEQ, b""]]
    dealer.close(linger=0)
