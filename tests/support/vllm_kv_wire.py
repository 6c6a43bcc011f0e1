"""vLLM 0.32's KV-cache event wire, read here with msgspec alone: the tests' own decoding,
independent of the proxy's (fleet/kv_events.py is the code under test, not a helper).

A published message is three ZMQ frames: the topic (as configured), the sequence number (8
bytes, big-endian, counting from 0 in each engine process) and the payload, a msgpack array
[ts, events, data_parallel_rank] whose events are maps tagged by "type": BlockStored,
BlockRemoved or AllBlocksCleared. The replay socket (ROUTER) answers a DEALER's [b"", start
seq] with [b"", topic, seq, payload] for each buffered message from that seq on, then
[b"", b"", END_SEQ, b""].
"""

from __future__ import annotations

import hashlib
import pickle
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

END_SEQ = (-1).to_bytes(8, "big", signed=True)
EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
# What vLLM hashes into the root of its block-hash chain when PYTHONHASHSEED is not set (with
# its default sha256 hashing).
CHAIN_ROOT = "vllm-none-hash"


@dataclass(frozen=True)
class Batch:
    topic: bytes
    seq: int
    ts: float
    events: tuple[dict[str, Any], ...]
    data_parallel_rank: int | None
    payload: bytes


def decode_batch(frames: Sequence[bytes]) -> Batch:
    """One published message (topic, seq, payload), checked for the shape vLLM sends."""
    assert len(frames) == 3, f"a KV-event message has 3 frames, not {len(frames)}"
    topic, seq, payload = frames
    assert len(seq) == 8, seq
    raw = msgspec.msgpack.decode(payload)
    assert isinstance(raw, list) and len(raw) in (2, 3), raw
    ts, events = raw[0], raw[1]
    assert isinstance(ts, float) and isinstance(events, list), raw
    for event in events:
        assert isinstance(event, dict) and event.get("type") in EVENT_TYPES, event
    rank = raw[2] if len(raw) == 3 else None
    return Batch(topic, int.from_bytes(seq, "big"), ts, tuple(events), rank, payload)


@dataclass(frozen=True)
class StoredBlock:
    block_hash: int
    parent: int | None
    token_ids: tuple[int, ...]


def stored_blocks(event: dict[str, Any]) -> list[StoredBlock]:
    """The blocks of one BlockStored event, each with its parent and its own tokens: the
    event's token_ids are its blocks' tokens back to back, block_size each, and each block's
    parent is the one before it (the first one's is the event's parent_block_hash)."""
    assert event["type"] == "BlockStored", event
    size, hashes, tokens = event["block_size"], event["block_hashes"], event["token_ids"]
    assert len(tokens) == size * len(hashes), (len(tokens), size, len(hashes))
    blocks, parent = [], event["parent_block_hash"]
    for i, block_hash in enumerate(hashes):
        blocks.append(StoredBlock(block_hash, parent, tuple(tokens[i * size : (i + 1) * size])))
        parent = block_hash
    return blocks


@dataclass
class CacheView:
    """The blocks an engine holds according to its events alone: stored and not since
    removed or cleared.

    vLLM can hold two copies of one block (a prompt that ends on a block boundary has its
    last block computed again when repeated): each copy has its own BlockStored and its own
    BlockRemoved, so copies are counted. A request with kv_cache_report_mode=full also
    re-reports the blocks it reused, which are no new copies: apply those with
    `re_report=True`. A view that starts after the engine did (`whole_history=False`) ignores
    the removal of blocks stored before it started."""

    whole_history: bool = True
    blocks: dict[int, StoredBlock] = field(default_factory=dict)
    copies: Counter[int] = field(default_factory=Counter)

    def apply(self, event: dict[str, Any], *, re_report: bool = False) -> None:
        if event["type"] == "BlockStored":
            for block in stored_blocks(event):
                if re_report and block.block_hash in self.blocks:
                    continue
                self.blocks[block.block_hash] = block
                self.copies[block.block_hash] += 1
        elif event["type"] == "BlockRemoved":
            for block_hash in event["block_hashes"]:
                if not self.whole_history and not self.copies[block_hash]:
                    continue
                assert self.copies[block_hash] > 0, f"removed {block_hash}, not stored"
                self.copies[block_hash] -= 1
                if not self.copies[block_hash]:
                    del self.blocks[block_hash], self.copies[block_hash]
        else:
            self.blocks.clear()
            self.copies.clear()

    def cached_prefix_blocks(self, token_ids: Sequence[int], block_size: int) -> int:
        """How many leading full blocks of `token_ids` the view holds, chained from the first."""
        by_content = {(b.parent, b.token_ids): h for h, b in self.blocks.items()}
        parent: int | None = None
        for i in range(len(token_ids) // block_size):
            found = by_content.get(
                (parent, tuple(token_ids[i * block_size : (i + 1) * block_size]))
            )
            if found is None:
                return i
            parent = found
        return len(token_ids) // block_size

    def expected_hit_tokens(self, prompt: Sequence[int], block_size: int) -> int:
        """vLLM's prefix-cache hit for `prompt`: its cached leading full blocks, but never the
        whole prompt (the last prompt token is always computed, for its logits)."""
        blocks = min(self.cached_prefix_blocks(prompt, block_size), (len(prompt) - 1) // block_size)
        return blocks * block_size


def vllm_block_hashes(
    token_ids: Sequence[int], block_size: int, root: str = CHAIN_ROOT
) -> list[int]:
    """vLLM 0.32's keys for the full blocks of `token_ids`, as its events publish them, with
    the default prefix_caching_hash_algo "sha256": each block's key is the SHA-256 of the
    pickled tuple (parent key, the block's token ids, extra keys), chained from a root key
    (the SHA-256 of the pickled `root`), and an event carries its last 8 bytes as an unsigned
    integer. Only for blocks without extra keys (no LoRA, multimodal input or cache_salt)."""

    def sha256(value: object) -> bytes:
        return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()

    parent = sha256(root)
    keys = []
    for i in range(len(token_ids) // block_size):
        parent = sha256((parent, tuple(token_ids[i * block_size : (i + 1) * block_size]), None))
        keys.append(int.from_bytes(parent[-8:], "big"))
    return keys
