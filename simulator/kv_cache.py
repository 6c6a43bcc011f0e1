"""Paged KV cache: fixed-size blocks, reference counts, and prefix caching by chained hashes.

As in vLLM's V1 block pool: a full block is identified by hash(parent block's hash, its token
ids); a cached block that no request references stays in the free queue and can be reused by
a later request with the same prefix until allocation evicts it, least recently freed first.
Two requests that computed the same block at once each cache their copy; the hash stays
cached until its last copy is evicted.
Usage counts cached-but-unreferenced blocks as free, as vLLM's `kv_cache_usage_perc` does.

With `record_events`, the pool also records vLLM's KV-cache events as they happen (a run of
blocks cached, a cached block evicted, the cache reset); whoever publishes them takes them
with `take_events` (simulator/kv_publisher.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from fleet.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

BlockHash = int
ROOT_HASH: BlockHash = 0


def chain_hashes(
    token_ids: Sequence[int],
    block_size: int,
    known: Sequence[BlockHash] = (),
    root: BlockHash = ROOT_HASH,
) -> list[BlockHash]:
    """Hashes of every full block of `token_ids`, reusing the already computed `known` prefix;
    `root` starts the chain (a LoRA adapter's own)."""
    hashes = list(known)
    parent = hashes[-1] if hashes else root
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class BlockPool:
    def __init__(
        self, num_blocks: int, enable_caching: bool = True, record_events: bool = False
    ) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        # vLLM publishes events only with prefix caching on: no cache, nothing to say.
        self.records_events = record_events and enable_caching
        self._events: list[KvEvent] = []
        self._refs = [0] * num_blocks
        self._hash_of: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}  # a block holding the hash
        self._copies: dict[BlockHash, list[int]] = {}  # the other blocks holding it, if any
        # Unreferenced blocks; the front is evicted first.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def lookup_prefix(self, hashes: Sequence[BlockHash]) -> list[int]:
        """Blocks holding the longest cached prefix of `hashes` (not yet referenced)."""
        if not self.enable_caching:
            return []
        found: list[int] = []
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks, pulling unreferenced ones out of the free queue."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """`n` fresh blocks, evicting least recently freed cached blocks; None if too few."""
        if n > len(self._free):
            return None
        out: list[int] = []
        for _ in range(n):
            b, _unused = self._free.popitem(last=False)
            h = self._hash_of[b]
            if h is not None:
                self._uncache(b, h)
                self._hash_of[b] = None
            self._refs[b] = 1
            out.append(b)
        return out

    def reuse_and_allocate(self, hits: Sequence[int], n: int) -> list[int] | None:
        """Take the cached `hits` a request reuses, then `n` fresh blocks. The hits are taken
        first, as vLLM touches a request's computed blocks before allocating, so allocating
        never evicts them; None, taking nothing, when too few blocks are free besides them."""
        idle_hits = sum(1 for b in hits if self._refs[b] == 0)
        if n > len(self._free) - idle_hits:
            return None
        self.touch(hits)
        fresh = self.allocate(n) if n > 0 else []
        assert fresh is not None  # counted above
        return fresh

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block. A request's blocks are freed tail first so that
        its last blocks, the least likely to be shared, are evicted first."""
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None

    def _uncache(self, b: int, h: BlockHash) -> None:
        copies = self._copies.get(h)
        if self._cached.get(h) == b:
            if copies:
                self._cached[h] = copies.pop()
            else:
                del self._cached[h]
        elif copies is not None:
            copies.remove(b)
        if copies is not None and not copies:
            del self._copies[h]
        if self.records_events:
            self._events.append(BlockRemoved([h], MEDIUM_GPU))  # one per copy, as vLLM

    def cache(self, block: int, h: BlockHash) -> None:
        """Record that `block` now holds the full block with hash `h`."""
        if not self.enable_caching or self._hash_of[block] is not None:
            return
        self._hash_of[block] = h
        if h in self._cached:
            self._copies.setdefault(h, []).append(block)
        else:
            self._cached[h] = block

    def record_stored(
        self,
        hashes: Sequence[BlockHash],
        parent: BlockHash | None,
        token_ids: Sequence[int],
        block_size: int,
        lora: str | None = None,
        lora_id: int | None = None,
    ) -> None:
        """A run of a request's blocks became full and cached: one event for the run, with
        the hash of the block before it (None at the prompt's start) and the run's tokens.
        A LoRA adapter's blocks carry it as vLLM's do: its id and name, and its name as each
        block's extra key (what else went into the block's hash)."""
        if self.records_events and hashes:
            self._events.append(
                BlockStored(
                    list(hashes),
                    parent,
                    list(token_ids),
                    block_size,
                    lora_id=lora_id,
                    medium=MEDIUM_GPU,
                    lora_name=lora,
                    extra_keys=None if lora is None else [[lora] for _ in hashes],
                )
            )

    def take_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    def reset_prefix_cache(self) -> bool:
        if any(self._refs):
            return False
        self._cached.clear()
        self._copies.clear()
        self._hash_of = [None] * self.num_blocks
        if self.records_events:
            self._events.append(AllBlocksCleared())
        return True
