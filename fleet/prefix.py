"""An approximate, bounded index of which backend holds which prompt prefix.

vLLM caches KV per full block and names a block by a chained hash of everything before it, so
a prefix that matches block i on a server matches blocks 0..i-1 too. Routers cannot see those
hashes cheaply, so (like llm-d's approximate prefix scorer) we hash the prompt *text* in blocks
of `chars_per_block` characters, each block's xxh3-64 seeded with the previous block's hash and
the first with the model name's (a block's hash covers the whole prefix up to it), and
remember which backend each block was last routed to. xxhash rather than hashlib: llm-d uses
it for exactly this and it is several times faster than blake2b on short inputs; the index is
approximate anyway, so a 64-bit non-cryptographic hash is enough.

Each backend keeps an LRU of its blocks, bounded like its real KV cache: by default
`default_capacity_blocks`, or, once the backend publishes `vllm:cache_config_info`,
`block_size * num_gpu_blocks` tokens converted to text blocks. A reverse map block -> backends
makes one lookup cost O(backends holding the first block x log blocks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, TypeVar

import xxhash

DEFAULT_CHARS_PER_BLOCK = 64  # llm-d: 16-token blocks x 4 characters per token
DEFAULT_CAPACITY_BLOCKS = 31_250  # llm-d's default LRU capacity per server
# Block hashes the prompt hasher keeps to resume from, per kind (sessions, sessionless): about
# 10 MB at most, 4,096 prompts of 64 blocks or 130 of 2,000.
DEFAULT_RESUME_BLOCKS = 262_144

K = TypeVar("K", bound=Hashable)


@lru_cache(maxsize=1024)  # a handful of model names, hashed once each rather than per request
def _model_seed(model: str) -> int:
    return xxhash.xxh64_intdigest(model.encode())


def _extend(data: bytes, start: int, chars_per_block: int, parent: int, hashes: list[int]) -> int:
    """Append the chained hashes of the full blocks of data[start:], the first one's parent
    hash being `parent`; returns the end of the last full block."""
    end = start + (len(data) - start) // chars_per_block * chars_per_block
    h, append, block_hash = parent, hashes.append, xxhash.xxh3_64_intdigest  # the hot loop
    for i in range(start, end, chars_per_block):
        h = block_hash(data[i : i + chars_per_block], h)
        append(h)
    return end


def block_hashes(text: str, model: str, chars_per_block: int) -> list[int]:
    """Chained hashes of the full `chars_per_block` blocks of `text`; a partial tail is not
    cached by vLLM either, so it is not hashed.

    Block i's hash is the xxh3-64 of its bytes seeded with block i-1's hash (block 0's with a
    hash of the model name): chained like vLLM's, so a block's hash stands for every block
    before it, with each byte read once and one C call per block."""
    hashes: list[int] = []
    data = text.encode("utf-8", "surrogatepass")
    if len(data) >= chars_per_block:
        _extend(data, 0, chars_per_block, _model_seed(model), hashes)
    return hashes


class _Resumable:
    __slots__ = ("digest", "hashes", "length")

    def __init__(self, length: int, digest: bytes, hashes: list[int]):
        self.length = length
        self.digest = digest
        self.hashes = hashes


class _ResumePoints(Generic[K]):
    """Resume points, least recently used first, bounded in number and in the block hashes
    they keep alive. An OrderedDict, read in place: a get-and-touch is two C calls, where
    cachetools' LRUCache runs Python per access."""

    __slots__ = ("blocks", "entries", "max_blocks", "max_entries")

    def __init__(self, max_entries: int, max_blocks: int) -> None:
        self.entries: OrderedDict[K, _Resumable] = OrderedDict()
        self.max_entries = max_entries
        self.max_blocks = max_blocks
        self.blocks = 0

    def put(self, key: K, entry: _Resumable) -> None:
        entries = self.entries
        old = entries.pop(key, None)
        if old is not None:
            self.blocks -= len(old.hashes)
        if len(entry.hashes) > self.max_blocks:
            return  # one prompt over the whole budget: not worth the memory
        entries[key] = entry
        self.blocks += len(entry.hashes)
        while len(entries) > self.max_entries or self.blocks > self.max_blocks:
            _, gone = entries.popitem(last=False)
            self.blocks -= len(gone.hashes)


class PromptHasher:
    """`block_hashes` that resumes from an earlier prompt when the new prompt extends it, so
    that a prompt hashes only its blocks not seen before.

    With a session, from the session's previous prompt (the multi-turn case: turn k re-sends
    turn k-1 and adds to it). Without one, from the latest prompt that began with the same
    first block: a conversation whose client sends no session id, or the same prompt sent
    again. A prompt is not kept, only a 128-bit digest of its hashed part, which one C call
    checks against the new prompt's head; a failed check costs that one call and the prompt
    is hashed from scratch. Each kind keeps at most `sessions` resume points and `max_blocks`
    block hashes in them, the least recently used going first."""

    def __init__(
        self,
        chars_per_block: int,
        sessions: int = 4096,
        max_blocks: int = DEFAULT_RESUME_BLOCKS,
    ) -> None:
        self.chars_per_block = chars_per_block
        self.capacity = sessions
        self._sessions: _ResumePoints[tuple[str, str]] = _ResumePoints(sessions, max_blocks)
        self._heads: _ResumePoints[int] = _ResumePoints(sessions, max_blocks)  # by 1st block
        self.resumed = 0

    def hashes(self, text: str, model: str, session: str | None = None) -> list[int]:
        data = text.encode("utf-8", "surrogatepass")
        cpb = self.chars_per_block
        if len(data) < cpb:
            return []
        seed = _model_seed(model)
        if session is None:
            first = xxhash.xxh3_64_intdigest(data[:cpb], seed)
            return self._resume(self._heads, first, data, seed, first)
        return self._resume(self._sessions, (model, session), data, seed, None)

    def _resume(
        self, points: _ResumePoints[K], key: K, data: bytes, seed: int, first: int | None
    ) -> list[int]:
        cpb = self.chars_per_block
        prev = points.entries.get(key)
        if (
            prev is not None
            and len(data) >= prev.length
            and xxhash.xxh3_128_digest(memoryview(data)[: prev.length]) == prev.digest
        ):
            points.entries.move_to_end(key)  # a use
            self.resumed += 1
            hashes, start = prev.hashes[:], prev.length
            if len(data) - start < cpb:
                return hashes  # no new full block: nothing to hash or to remember
        elif first is None:
            hashes, start = [], 0
        else:  # the first block, hashed for the key already
            hashes, start = [first], cpb
        end = _extend(data, start, cpb, hashes[-1] if hashes else seed, hashes)
        points.put(key, _Resumable(end, xxhash.xxh3_128_digest(memoryview(data)[:end]), hashes))
        return hashes


def capacity_from_cache_config(
    block_size: int, num_gpu_blocks: int, chars_per_block: int, chars_per_token: float = 4.0
) -> int:
    """Text blocks that fit in a server's KV cache of `block_size * num_gpu_blocks` tokens."""
    tokens = block_size * num_gpu_blocks
    return max(1, int(tokens * chars_per_token // chars_per_block))


@dataclass(slots=True)  # not frozen: made per request, and a frozen init costs 3x
class PrefixMatch:
    """Leading blocks of one prompt found per backend (backends with no match are absent)."""

    total_blocks: int
    matched: Mapping[str, int]
    chars_per_block: int

    def blocks(self, backend_id: str) -> int:
        return self.matched.get(backend_id, 0)

    def ratio(self, backend_id: str) -> float:
        if self.total_blocks == 0:
            return 0.0
        return self.matched.get(backend_id, 0) / self.total_blocks

    @property
    def best_blocks(self) -> int:
        return max(self.matched.values(), default=0)


class PrefixIndex:
    def __init__(
        self,
        chars_per_block: int = DEFAULT_CHARS_PER_BLOCK,
        default_capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
    ) -> None:
        if chars_per_block < 1 or default_capacity_blocks < 1:
            raise ValueError("chars_per_block and default_capacity_blocks must be >= 1")
        self.chars_per_block = chars_per_block
        self.default_capacity_blocks = default_capacity_blocks
        self._blocks: dict[str, OrderedDict[int, None]] = {}  # backend -> LRU of block hashes
        self._capacity: dict[str, int] = {}
        self._owners: dict[int, set[str]] = {}  # block hash -> backends holding it
        # backend -> the blocks of its last `record`, while they are still its most recent
        # blocks in that order: recording them again would change nothing.
        self._latest: dict[str, list[int]] = {}
        self._size = 0
        self._hasher = PromptHasher(chars_per_block)

    def hashes(self, text: str, model: str, session: str | None = None) -> list[int]:
        """The prompt's block hashes; resumed from an earlier prompt it extends."""
        return self._hasher.hashes(text, model, session)

    def match(self, hashes: list[int]) -> PrefixMatch:
        """How many leading blocks of `hashes` each backend holds.

        A backend holds a prefix of every prompt's blocks: hashes are chained, so whatever
        prompt sent it block i sent it blocks 0..i-1 too, and `record` makes a prompt's tail
        the first of its blocks to be evicted. So each backend holding the first block is
        asked for the last one (one lookup for a backend holding the whole prompt, the common
        case) and otherwise binary-searched for its last held block: O(owners x log blocks)
        lookups instead of walking every block."""
        if not hashes:
            return PrefixMatch(0, {}, self.chars_per_block)
        first = self._owners.get(hashes[0])
        matched: dict[str, int] = {}
        n = len(hashes)
        last = hashes[-1]
        for backend in first or ():
            lru = self._blocks[backend]
            if last in lru:
                matched[backend] = n
                continue
            lo, hi = 1, n - 1  # lru holds hashes[:lo], not hashes[n-1]; find the largest lo
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if hashes[mid - 1] in lru:
                    lo = mid
                else:
                    hi = mid - 1
            matched[backend] = lo
        return PrefixMatch(n, matched, self.chars_per_block)

    def record(self, backend_id: str, hashes: Sequence[int]) -> None:
        """The prompt with these blocks was routed to `backend_id`: it will hold them.

        Blocks are touched last-to-first so that a prompt's leading blocks are the most recent
        and its tail is evicted first, as vLLM frees a request's blocks tail first: evicting a
        leading block would orphan every block chained after it."""
        if self._latest.get(backend_id) == hashes:
            return  # the same prompt again: its blocks are already the most recent, in order
        lru = self._blocks.get(backend_id)
        if lru is None:
            lru = self._blocks[backend_id] = OrderedDict()
        # The backend holds a prefix of the prompt (see `match`): the blocks it lacks are the
        # last ones, found from the end by lookups (not by a KeyError per new block) and
        # inserted; the blocks it holds are touched. Should one of those be missing after
        # all, the head is redone block by block: touching again, in the same order, the
        # blocks already touched changes nothing.
        n = held = len(hashes)
        while held and hashes[held - 1] not in lru:
            held -= 1
        for i in range(n - 1, held - 1, -1):
            self._insert(backend_id, lru, hashes[i])
        touch = lru.move_to_end  # bound once: this loop runs per block of every request
        try:
            for h in reversed(hashes) if held == n else reversed(hashes[:held]):
                touch(h)
        except KeyError:
            for h in reversed(hashes[:held]):
                if h in lru:
                    touch(h)
                else:
                    self._insert(backend_id, lru, h)
        cap = self.capacity(backend_id)
        self._evict(backend_id, lru, cap)
        if len(hashes) <= cap:  # eviction takes the oldest blocks first, none of these
            self._latest[backend_id] = list(hashes)
        else:
            self._latest.pop(backend_id, None)

    def _insert(self, backend_id: str, lru: OrderedDict[int, None], h: int) -> None:
        if h in lru:  # a block seen twice in one prompt: its hash chain repeated itself
            lru.move_to_end(h)
            return
        lru[h] = None
        self._size += 1
        owners = self._owners.get(h)
        if owners is None:
            self._owners[h] = {backend_id}
        else:
            owners.add(backend_id)

    def set_capacity(self, backend_id: str, blocks: int) -> None:
        cap = self._capacity[backend_id] = max(1, blocks)
        self._latest.pop(backend_id, None)  # rare (a capacity that changed): no reasoning
        lru = self._blocks.get(backend_id)
        if lru is not None:
            self._evict(backend_id, lru, cap)

    def capacity(self, backend_id: str) -> int:
        return self._capacity.get(backend_id, self.default_capacity_blocks)

    def remove_backend(self, backend_id: str) -> None:
        lru = self._blocks.pop(backend_id, None)
        self._capacity.pop(backend_id, None)
        self._latest.pop(backend_id, None)
        if lru is None:
            return
        for h in lru:
            self._drop_owner(h, backend_id)
        self._size -= len(lru)

    def size(self) -> int:
        """Blocks held over all backends (one block held by two backends counts twice)."""
        return self._size

    def backend_blocks(self, backend_id: str) -> int:
        lru = self._blocks.get(backend_id)
        return 0 if lru is None else len(lru)

    def _evict(self, backend_id: str, lru: OrderedDict[int, None], cap: int) -> None:
        while len(lru) > cap:
            h, _ = lru.popitem(last=False)
            self._size -= 1
            self._drop_owner(h, backend_id)

    def _drop_owner(self, h: int, backend_id: str) -> None:
        owners = self._owners.get(h)
        if owners is None:
            return
        owners.discard(backend_id)
        if not owners:
            del self._owners[h]
