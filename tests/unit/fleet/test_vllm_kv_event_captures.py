"""The golden KV-cache event captures of real vLLM 0.32 (tests/golden/vllm-0.32/kv-events,
scripts/real_vllm/capture_kv_events.py), read with the tests' own decoding: what they prove
about vLLM's events holds in every test run, without an engine."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from tests.support.vllm_kv_wire import (
    END_SEQ,
    Batch,
    CacheView,
    decode_batch,
    stored_blocks,
    vllm_block_hashes,
)

CAPTURE = Path(__file__).resolve().parents[2] / "golden" / "vllm-0.32" / "kv-events"


@cache
def manifest() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CAPTURE / "manifest.json").read_text())
    return data


def published() -> list[tuple[dict[str, Any], list[bytes], Batch]]:
    out = []
    for frame in manifest()["frames"]:
        raw = [
            (CAPTURE / frame["files"][part]).read_bytes() for part in ("topic", "seq", "payload")
        ]
        out.append((frame, raw, decode_batch(raw)))
    return out


def full_report(body: dict[str, Any]) -> bool:
    """Whether the request asked vLLM to re-report the blocks it reused."""
    return bool((body.get("vllm_xargs") or {}).get("kv_cache_report_mode") == "full")


def block_size() -> int:
    size: int = manifest()["engine"]["block_size"]
    return size


def test_messages_carry_the_topic_and_consecutive_sequence_numbers() -> None:
    topic = manifest()["engine"]["kv_events_config"]["topic"].encode()
    batches = [batch for _, _, batch in published()]
    assert [b.seq for b in batches] == list(range(len(batches)))
    assert [f["seq"] for f in manifest()["frames"]] == [b.seq for b in batches]
    assert all(b.topic == topic for b in batches)
    assert all(b.data_parallel_rank == 0 for b in batches)
    decoded = json.loads((CAPTURE / "decoded.json").read_text())
    assert [d["events"] for d in decoded] == [list(b.events) for b in batches]


def test_stored_blocks_are_the_requests_blocks_chained_by_vllms_own_hash() -> None:
    """Each step's BlockStored blocks are full blocks of its prompt + output, keyed by the
    chained SHA-256 vLLM computes (recomputed here from the token ids alone), each one's
    parent the block before it; without kv_cache_report_mode=full only the blocks the step
    newly computed are reported, with it the reused ones too."""
    size = block_size()
    batches = published()
    view = CacheView()
    for step in manifest()["steps"]:
        body = step["request"]["body"]
        step_batches = [b for frame, _, b in batches if frame["step"] == step["name"]]
        if body is None:  # the reset: nothing is published until the next step
            assert step_batches == [], step
            continue
        tokens = body["prompt"] + step["answer"]["token_ids"]
        keys = vllm_block_hashes(tokens, size)
        # KV exists for every token but the last sampled one.
        computed = (len(tokens) - 1) // size
        # A reset is announced at the head of the next step's batch, before its lookups.
        for event in step_batches[0].events:
            if event["type"] != "AllBlocksCleared":
                break
            view.apply(event)
        hit_blocks = view.expected_hit_tokens(body["prompt"], size) // size
        stored = [
            blk
            for batch in step_batches
            for event in batch.events
            if event["type"] == "BlockStored"
            for blk in stored_blocks(event)
        ]
        first = 0 if full_report(body) else hit_blocks
        assert [blk.block_hash for blk in stored] == keys[first:computed], step["name"]
        for blk in stored:
            i = keys.index(blk.block_hash)
            assert blk.token_ids == tuple(tokens[i * size : (i + 1) * size])
            assert blk.parent == (keys[i - 1] if i else None)
        for batch in step_batches:
            for event in batch.events:
                view.apply(event, re_report=full_report(body))


def test_prefix_cache_hits_in_metrics_match_the_blocks_the_events_say_are_held() -> None:
    """Before each request, the events so far (a reset counting from the batch that announces
    it) say which leading blocks of its prompt the engine holds; the engine's
    prefix_cache_hits_total rises by exactly those tokens, and queries by the prompt."""
    size = block_size()
    batches = published()
    view = CacheView()
    seen_hits = []
    for step in manifest()["steps"]:
        body = step["request"]["body"]
        step_batches = [b for frame, _, b in batches if frame["step"] == step["name"]]
        if body is None:
            assert step["answer"] == {"success": True}
            continue
        for event in step_batches[0].events:
            if event["type"] != "AllBlocksCleared":
                break
            view.apply(event)
        expected = view.expected_hit_tokens(body["prompt"], size)
        assert step["metrics_delta"]["prefix_cache_hits"] == expected, step["name"]
        assert step["metrics_delta"]["prefix_cache_queries"] == len(body["prompt"])
        seen_hits.append(expected)
        for batch in step_batches:
            for event in batch.events:
                view.apply(event, re_report=full_report(body))
    assert any(seen_hits), "the capture has no prefix-cache hit at all"


def test_the_capture_shows_eviction_and_the_reset() -> None:
    types = [e["type"] for _, _, b in published() for e in b.events]
    assert "BlockRemoved" in types
    assert types.count("AllBlocksCleared") == 1
    after_reset = next(b for f, _, b in published() if f["step"] == "after_reset")
    assert after_reset.events[0]["type"] == "AllBlocksCleared"


def test_replay_answers_every_buffered_message_from_the_asked_seq_then_end() -> None:
    replay = manifest()["replay"]
    request = [(CAPTURE / name).read_bytes() for name in replay["request_files"]]
    assert request == [b"", replay["start_seq"].to_bytes(8, "big")]
    replies = [[(CAPTURE / n).read_bytes() for n in r["files"]] for r in replay["replies"]]
    pub = {batch.seq: raw for _, raw, batch in published()}
    assert replies[-1] == [b"", b"", END_SEQ, b""]
    seqs = [int.from_bytes(r[2], "big") for r in replies[:-1]]
    assert seqs == list(range(replay["start_seq"], max(pub) + 1))
    for reply in replies[:-1]:
        assert reply[0] == b""
        assert reply[1:] == pub[int.from_bytes(reply[2], "big")]
