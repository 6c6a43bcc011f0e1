"""Paged KV cache: fixed-size blocks, reference counts, and prefix caching by chained hashes.

As in vLLM's V1 block pool: a full block is identified by hash(parent block's hash, its token
ids); a cached block that no request references stays in the free queue and can be reused by
a later request with the same prefix until allocation evicts it, least recently freed first.
Usage counts cached-but-unreferenced blocks as free, as vLLM's `kv_cache_usage_perc` does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

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
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._refs = [0] * num_blocks
        self._hash_of: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}
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
                if self._cached.get(h) == b:
                    del self._cached[h]
                self._hash_of[b] = None
            self._refs[b] = 1
            out.append(b)
        return out

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block. A request's blocks are freed tail first so that
        its last blocks, the least likely to be shared, are evicted first."""
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None

    def cache(self, block: int, h: BlockHash) -> None:
        """Record that `block` now holds the full block with hash `h`."""
        if not self.enable_caching or self._hash_of[block] is not None:
            return
        if h not in self._cached:
            self._cached[h] = block
            self._hash_of[block] = h

    def reset_prefix_cache(self) -> bool:
        if any(self._refs):
            return False
        self._cached.clear()
        self._hash_of = [None] * self.num_blocks
        return True
