"""Which prompt prefixes each backend really holds, from its own KV-cache events. No I/O.

An engine names a cached block by a chained hash of everything up to its end, with a hash
function and seed a router cannot reproduce. So every block gets a key of ours, computed from
what the event carries: key = xxh3-64 of the block's token ids, seeded with the parent
block's key (block 0: a fixed root). A prompt's keys, computed the same way from its token
ids in blocks of the engine's block size, then name the same blocks. Per backend the index
keeps engine hash -> our key, so that `BlockRemoved` (which carries engine hashes only) can be
applied, and our key -> how many engine hashes name it.

An engine caches one copy of a block per request that computed it at the same time, and
announces each copy stored and each copy evicted: a hash is held until its last copy goes,
so copies are counted.

- A stored block whose parent is unknown (stored before we listened, or its event was lost)
  cannot be keyed: it is counted and left out, as are its descendants.
- Blocks hashed with anything besides their tokens (LoRA adapter, multimodal items, cache
  salt) get keys no plain prompt produces, so they never match one.
- Only the GPU tier is tracked (events without a medium are GPU ones): an offloading tier's
  events would otherwise remove blocks the GPU still holds.
- Each backend holds at most `max_blocks_per_backend` blocks; past that the oldest stored go
  first (a lost `BlockRemoved` must not grow the index forever).

A backend is *precise* once its index can be trusted: from a reset that is known complete
(the engine's stream seen from sequence 0, or a cache clear), or `warmup_s` after a reset
that is not (joined mid-stream, or a lost batch): until then blocks stored before are
missing, and routing falls back to the approximate index for it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import msgspec
import xxhash

from fleet.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, EngineHash

ROOT_KEY = 0
DEFAULT_MAX_BLOCKS_PER_BACKEND = 262_144
DEFAULT_WARMUP_S = 60.0

_EMPTY: Mapping[str, int] = MappingProxyType({})


def _token_bytes(token_ids: Sequence[int]) -> bytes | None:
    """Token ids as 4-byte unsigned ints; None for an id no tokenizer produces."""
    if isinstance(token_ids, array) and token_ids.typecode == "I":
        return token_ids.tobytes()  # a tokenizer's answer, already packed
    try:
        return array("I", token_ids).tobytes()
    except (OverflowError, TypeError):
        return None


def chain_keys(
    token_ids: Sequence[int],
    block_size: int,
    parent: int = ROOT_KEY,
    salts: Sequence[bytes | None] = (),
) -> list[int]:
    """Our keys of the full blocks of `token_ids`, chained from `parent`. `salts[i]`, when
    given and not None, is mixed into block i (what else the engine hashed into it)."""
    data = _token_bytes(token_ids)
    if data is None or block_size < 1:
        return []
    view = memoryview(data)
    step = block_size * 4
    keys: list[int] = []
    digest = xxhash.xxh3_64_intdigest
    for i, start in enumerate(range(0, len(data) - step + 1, step)):
        block = view[start : start + step]
        salt = salts[i] if i < len(salts) else None
        parent = digest(block if salt is None else bytes(block) + b"\x00" + salt, seed=parent)
        keys.append(parent)
    return keys


def _salts(event: BlockStored) -> list[bytes | None]:
    n = len(event.block_hashes)
    extra = event.extra_keys or []
    salts: list[bytes | None] = []
    for i in range(n):
        keys = extra[i] if i < len(extra) else None
        if event.lora_name is None and event.lora_id is None and keys is None:
            salts.append(None)
        else:
            salts.append(msgspec.msgpack.encode([event.lora_name, event.lora_id, keys]))
    return salts


@dataclass(slots=True)
class _Held:
    block_size: int | None = None
    by_engine: dict[EngineHash, int] = field(default_factory=dict)  # insertion order = age
    copies: dict[EngineHash, int] = field(default_factory=dict)  # hashes stored more than once
    keys: dict[int, int] = field(default_factory=dict)  # our key -> engine blocks holding it
    precise_from: float = float("inf")


@dataclass(slots=True)
class IndexCounters:
    stored: int = 0  # blocks indexed
    removed: int = 0
    cleared: int = 0
    orphaned: int = 0  # stored blocks left out: unknown parent
    unaligned: int = 0  # stored blocks left out: not whole blocks of the engine's size
    other_medium: int = 0  # events of a tier other than the GPU's, ignored
    overflowed: int = 0  # blocks dropped to stay within max_blocks_per_backend


@dataclass(frozen=True, slots=True)
class PreciseMatch:
    """Leading blocks of one prompt held per backend (backends holding none are absent)."""

    num_tokens: int
    held: Mapping[str, int]  # backend -> leading blocks held
    block_sizes: Mapping[str, int]  # backend -> its block size, for every backend tracked

    def blocks(self, backend_id: str) -> int:
        return self.held.get(backend_id, 0)

    def cached_tokens(self, backend_id: str) -> int:
        return self.held.get(backend_id, 0) * self.block_sizes.get(backend_id, 0)

    def ratio(self, backend_id: str) -> float:
        """Leading blocks held / the prompt's full blocks on that backend."""
        size = self.block_sizes.get(backend_id)
        if not size:
            return 0.0
        full = self.num_tokens // size
        return 0.0 if full == 0 else self.held.get(backend_id, 0) / full


NO_MATCH = PreciseMatch(0, _EMPTY, _EMPTY)


class PrecisePrefixIndex:
    def __init__(
        self,
        max_blocks_per_backend: int = DEFAULT_MAX_BLOCKS_PER_BACKEND,
        warmup_s: float = DEFAULT_WARMUP_S,
    ) -> None:
        if max_blocks_per_backend < 1 or warmup_s < 0:
            raise ValueError("max_blocks_per_backend must be >= 1 and warmup_s >= 0")
        self.max_blocks = max_blocks_per_backend
        self.warmup_s = warmup_s
        self._backends: dict[str, _Held] = {}
        self.counters = IndexCounters()

    # ---- what the event stream does ----------------------------------------------------------
    def reset(self, backend_id: str, now: float, *, complete: bool) -> None:
        """Start `backend_id` over, empty. `complete`: the engine's cache is known to be what
        the events from here on say (its stream from sequence 0, or a replay of all of it)."""
        held = _Held()
        held.precise_from = now if complete else now + self.warmup_s
        self._backends[backend_id] = held

    def forget(self, backend_id: str) -> None:
        self._backends.pop(backend_id, None)

    def apply(
        self,
        backend_id: str,
        events: Iterable[BlockStored | BlockRemoved | AllBlocksCleared],
        now: float,
    ) -> None:
        held = self._backends.get(backend_id)
        if held is None:
            held = self._backends[backend_id] = _Held()
        for event in events:
            if isinstance(event, BlockStored):
                if _gpu(event.medium):
                    self._store(held, event)
                else:
                    self.counters.other_medium += 1
            elif isinstance(event, BlockRemoved):
                if _gpu(event.medium):
                    self._remove(held, event.block_hashes)
                else:
                    self.counters.other_medium += 1
            else:
                # A cleared cache is an empty one: the index is complete from here.
                block_size = held.block_size
                held = self._backends[backend_id] = _Held(block_size, precise_from=now)
                self.counters.cleared += 1

    def _store(self, held: _Held, event: BlockStored) -> None:
        hashes, size, counters = event.block_hashes, event.block_size, self.counters
        # The first event fixes the block size; an engine only changes it by restarting
        # (a reset). Other sizes are partial-block entries, which no full prompt block names.
        if held.block_size is None and size >= 1:
            held.block_size = size
        if size != held.block_size or len(event.token_ids) != len(hashes) * size:
            counters.unaligned += len(hashes)
            return
        parent_hash = event.parent_block_hash
        parent = ROOT_KEY
        if parent_hash is not None:
            known = held.by_engine.get(parent_hash)
            if known is None:
                counters.orphaned += len(hashes)
                return
            parent = known
        keys = chain_keys(event.token_ids, size, parent, _salts(event))
        by_engine, ours = held.by_engine, held.keys
        for engine_hash, key in zip(hashes, keys, strict=False):
            if engine_hash in by_engine:
                held.copies[engine_hash] = held.copies.get(engine_hash, 1) + 1
                continue
            by_engine[engine_hash] = key
            ours[key] = ours.get(key, 0) + 1
            counters.stored += 1
        while len(by_engine) > self.max_blocks:
            oldest = next(iter(by_engine))
            self._drop(held, oldest)
            counters.overflowed += 1

    def _remove(self, held: _Held, hashes: Iterable[EngineHash]) -> None:
        copies = held.copies
        for engine_hash in hashes:
            left = copies.get(engine_hash)
            if left is not None:  # another copy still holds it
                if left > 2:
                    copies[engine_hash] = left - 1
                else:
                    del copies[engine_hash]
            elif engine_hash in held.by_engine:
                self._drop(held, engine_hash)
                self.counters.removed += 1

    @staticmethod
    def _drop(held: _Held, engine_hash: EngineHash) -> None:
        held.copies.pop(engine_hash, None)
        key = held.by_engine.pop(engine_hash)
        left = held.keys[key] - 1
        if left:
            held.keys[key] = left
        else:
            del held.keys[key]

    # ---- what routing asks ------------------------------------------------------------------
    def precise(self, backend_id: str, now: float) -> bool:
        held = self._backends.get(backend_id)
        return held is not None and now >= held.precise_from

    def tracked(self) -> list[str]:
        return list(self._backends)

    def blocks(self, backend_id: str) -> int:
        held = self._backends.get(backend_id)
        return 0 if held is None else len(held.by_engine)

    def match(self, token_ids: Sequence[int]) -> PreciseMatch:
        """How many leading full blocks of the prompt each tracked backend holds. Walked
        block by block: the answer is exact even where the engine evicted a middle block."""
        sizes: dict[str, int] = {}
        found: dict[str, int] = {}
        keys_by_size: dict[int, list[int]] = {}
        for backend_id, held in self._backends.items():
            size = held.block_size
            if size is None:
                continue
            sizes[backend_id] = size
            keys = keys_by_size.get(size)
            if keys is None:
                keys = keys_by_size[size] = chain_keys(token_ids, size)
            ours = held.keys
            n = 0
            for key in keys:
                if key not in ours:
                    break
                n += 1
            if n:
                found[backend_id] = n
        return PreciseMatch(len(token_ids), found, sizes)


def _gpu(medium: str | None) -> bool:
    return medium is None or medium == MEDIUM_GPU
