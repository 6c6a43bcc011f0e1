"""The precise prefix index: built from BlockStored / BlockRemoved / AllBlocksCleared, matched
against a prompt's token ids, bounded, and trusted only once complete."""

from __future__ import annotations

import pytest

from fleet.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from fleet.precise_prefix import PrecisePrefixIndex, chain_keys

BS = 4
PROMPT = list(range(100, 124))  # 6 full blocks of 4


def stored(hashes: list[int], first_block: int, parent: int | None, **extra: object) -> BlockStored:
    start = first_block * BS
    tokens = PROMPT[start : start + len(hashes) * BS]
    return BlockStored(hashes, parent, tokens, BS, **extra)  # type: ignore[arg-type]


def index_with(*events: object, backend: str = "a", now: float = 0.0) -> PrecisePrefixIndex:
    index = PrecisePrefixIndex(warmup_s=10.0)
    index.reset(backend, now, complete=True)
    index.apply(backend, events, now)  # type: ignore[arg-type]
    return index


def test_stored_blocks_match_the_prompts_leading_blocks() -> None:
    # The engine stores blocks 0-1 for one request, then 2-3 chained to block 1.
    index = index_with(stored([900, 901], 0, None), stored([902, 903], 2, 901))
    match = index.match(PROMPT)
    assert match.blocks("a") == 4
    assert match.cached_tokens("a") == 16
    assert match.ratio("a") == pytest.approx(4 / 6)
    # A prompt that differs in block 1 shares only block 0.
    other = PROMPT[:4] + [1] * 20
    assert index.match(other).blocks("a") == 1
    assert index.match([7] * 24).blocks("a") == 0


def test_keys_do_not_depend_on_the_engines_hashes() -> None:
    a = index_with(stored([1, 2, 3], 0, None))
    b = index_with(stored([b"x", b"y", b"z"], 0, None))
    assert a.match(PROMPT).blocks("a") == b.match(PROMPT).blocks("a") == 3


def test_removed_block_cuts_the_leading_run_there() -> None:
    index = index_with(stored([900, 901, 902, 903], 0, None), BlockRemoved([902]))
    assert index.match(PROMPT).blocks("a") == 2
    assert index.blocks("a") == 3
    index.apply("a", [BlockRemoved([900])], 0.0)
    assert index.match(PROMPT).blocks("a") == 0


def test_a_block_cached_twice_is_held_until_both_copies_go() -> None:
    # Two requests computed the same blocks at once: the engine caches and evicts each copy.
    index = index_with(stored([900, 901], 0, None), stored([900, 901], 0, None))
    assert index.blocks("a") == 2
    index.apply("a", [BlockRemoved([901])], 0.0)
    assert index.match(PROMPT).blocks("a") == 2
    index.apply("a", [BlockRemoved([901])], 0.0)
    assert index.match(PROMPT).blocks("a") == 1
    index.apply("a", [BlockRemoved([901])], 0.0)  # one removal too many changes nothing
    assert index.match(PROMPT).blocks("a") == 1


def test_cleared_cache_empties_the_backend_only() -> None:
    index = index_with(stored([900, 901], 0, None))
    index.reset("b", 0.0, complete=True)
    index.apply("b", [stored([1], 0, None)], 0.0)
    index.apply("a", [AllBlocksCleared()], 0.0)
    match = index.match(PROMPT)
    assert match.blocks("a") == 0 and match.blocks("b") == 1
    assert index.counters.cleared == 1


def test_unknown_parent_is_left_out_with_its_children() -> None:
    index = index_with(stored([902], 2, 901), stored([903], 3, 902))
    assert index.blocks("a") == 0
    assert index.counters.orphaned == 2
    assert index.match(PROMPT).blocks("a") == 0


def test_other_tiers_and_partial_blocks_are_ignored() -> None:
    index = index_with(
        stored([900], 0, None, medium="CPU"),
        BlockStored([950], None, PROMPT[:2], 2),  # a partial block: another size
        stored([900], 0, None, medium="GPU"),
        BlockRemoved([900], medium="CPU"),
    )
    assert index.match(PROMPT).blocks("a") == 1
    assert index.counters.other_medium == 2
    assert index.counters.unaligned == 1


def test_salted_blocks_never_match_a_plain_prompt() -> None:
    index = index_with(
        stored([900, 901], 0, None, lora_name="adapter", lora_id=1),
        stored([700], 0, None, extra_keys=[["salt"]]),
    )
    assert index.blocks("a") == 3
    assert index.match(PROMPT).blocks("a") == 0


def test_memory_is_bounded_per_backend_oldest_first() -> None:
    index = PrecisePrefixIndex(max_blocks_per_backend=3)
    index.reset("a", 0.0, complete=True)
    index.apply("a", [stored([900, 901, 902, 903, 904], 0, None)], 0.0)
    assert index.blocks("a") == 3
    assert index.counters.overflowed == 2
    assert index.match(PROMPT).blocks("a") == 0  # blocks 0 and 1 went first


def test_an_incomplete_reset_is_trusted_after_the_warmup() -> None:
    index = PrecisePrefixIndex(warmup_s=10.0)
    index.reset("a", 100.0, complete=False)
    index.reset("b", 100.0, complete=True)
    assert not index.precise("a", 109.9) and index.precise("a", 110.0)
    assert index.precise("b", 100.0)
    assert not index.precise("unknown", 1e9)
    # A clear makes it complete at once.
    index.reset("a", 200.0, complete=False)
    index.apply("a", [AllBlocksCleared()], 201.0)
    assert index.precise("a", 201.0)


def test_match_per_block_size_and_forget() -> None:
    index = index_with(stored([900, 901], 0, None))
    index.reset("b", 0.0, complete=True)
    index.apply("b", [BlockStored([1], None, PROMPT[:8], 8)], 0.0)
    match = index.match(PROMPT)
    assert (match.blocks("a"), match.blocks("b")) == (2, 1)
    assert match.ratio("b") == pytest.approx(1 / 3)
    index.forget("a")
    assert index.tracked() == ["b"]


def test_chain_keys_chain_and_refuse_impossible_ids() -> None:
    keys = chain_keys(PROMPT, BS)
    assert len(keys) == 6 and len(set(keys)) == 6
    assert chain_keys(PROMPT[4:], BS, parent=keys[0]) == keys[1:]
    assert chain_keys([-1, 2, 3, 4], BS) == []
    assert chain_keys(PROMPT[:3], BS) == []
