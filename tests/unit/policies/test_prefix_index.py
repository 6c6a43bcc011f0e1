from __future__ import annotations

import pytest

from fleet.prefix import PrefixIndex, PromptHasher, block_hashes, capacity_from_cache_config
from tests.unit.policies.builders import text_blocks


def test_hashes_are_chained_full_blocks_seeded_by_model() -> None:
    a = block_hashes("a" * 64 + "b" * 64 + "tail", "m1", 64)
    assert len(a) == 2  # the partial tail is not a block
    # Same second block after a different first block: a different hash (chained).
    b = block_hashes("c" * 64 + "b" * 64, "m1", 64)
    assert a[1] != b[1]
    # Same text for another model: different hashes (seeded by the model name).
    assert block_hashes("a" * 64, "m2", 64) != a[:1]
    assert block_hashes("a" * 64 + "b" * 64, "m1", 64) == a


@pytest.mark.parametrize(
    ("recorded", "asked", "expected"),
    [
        # backend -> blocks recorded; prompt blocks asked; expected leading matches
        ({"A": 4}, 4, {"A": 4}),
        ({"A": 4}, 6, {"A": 4}),
        ({"A": 2, "B": 4}, 4, {"A": 2, "B": 4}),
        ({"A": 4, "B": 4}, 2, {"A": 2, "B": 2}),
        ({}, 3, {}),
    ],
)
def test_match_counts_leading_blocks_per_backend(
    recorded: dict[str, int], asked: int, expected: dict[str, int]
) -> None:
    index = PrefixIndex(chars_per_block=64)
    for bid, n in recorded.items():
        index.record(bid, index.hashes(text_blocks(n), "m"))
    match = index.match(index.hashes(text_blocks(asked), "m"))
    assert dict(match.matched) == expected
    assert match.total_blocks == asked


def test_divergence_in_the_middle_stops_the_match() -> None:
    index = PrefixIndex(chars_per_block=64)
    index.record("A", index.hashes(text_blocks(3, "x") + text_blocks(3, "y"), "m"))
    asked = index.hashes(text_blocks(3, "x") + text_blocks(3, "z"), "m")
    assert index.match(asked).blocks("A") == 3
    assert index.match(asked).ratio("A") == pytest.approx(0.5)


def test_lru_capacity_evicts_tails_of_old_prompts_first() -> None:
    index = PrefixIndex(chars_per_block=64, default_capacity_blocks=6)
    old = index.hashes(text_blocks(4, "o"), "m")
    new = index.hashes(text_blocks(4, "n"), "m")
    index.record("A", old)
    index.record("A", new)
    assert index.backend_blocks("A") == 6
    assert index.match(new).blocks("A") == 4
    # The old prompt lost its last two blocks, not its first: its head still matches.
    assert index.match(old).blocks("A") == 2
    assert index.size() == 6


def test_capacity_from_cache_config_and_shrinking_evicts() -> None:
    # 16-token blocks x 100 GPU blocks = 1600 tokens = 6400 chars = 100 blocks of 64 chars.
    assert capacity_from_cache_config(16, 100, 64) == 100
    index = PrefixIndex(chars_per_block=64)
    index.record("A", index.hashes(text_blocks(10), "m"))
    index.set_capacity("A", 3)
    assert index.backend_blocks("A") == 3
    assert index.match(index.hashes(text_blocks(10), "m")).blocks("A") == 3


def test_remove_backend_forgets_its_blocks_only() -> None:
    index = PrefixIndex(chars_per_block=64)
    h = index.hashes(text_blocks(3), "m")
    index.record("A", h)
    index.record("B", h)
    index.remove_backend("A")
    assert dict(index.match(h).matched) == {"B": 3}
    assert index.size() == 3


def test_rejects_nonsense_sizes() -> None:
    with pytest.raises(ValueError):
        PrefixIndex(chars_per_block=0)


def test_session_hasher_resumes_and_always_equals_hashing_from_scratch() -> None:
    hasher = PromptHasher(chars_per_block=64)
    turns = [
        text_blocks(3),
        text_blocks(5) + "partial tail",
        text_blocks(9),
        text_blocks(9),  # the same prompt again
        text_blocks(2, "other"),  # the session changed course: start over
        text_blocks(2, "other") + text_blocks(4, "more"),
        "short",
    ]
    for text in turns:
        assert hasher.hashes(text, "m", "s1") == block_hashes(text, "m", 64)
    assert hasher.resumed == 4
    # Without a session, or for another model, nothing is shared.
    assert hasher.hashes(turns[2], "m") == block_hashes(turns[2], "m", 64)
    assert hasher.hashes(turns[2], "m2", "s1") == block_hashes(turns[2], "m2", 64)


def test_session_hasher_is_bounded() -> None:
    hasher = PromptHasher(chars_per_block=64, sessions=2)
    for s in "abc":
        hasher.hashes(text_blocks(2), "m", s)
    hasher.hashes(text_blocks(3), "m", "a")  # evicted: hashed from scratch
    assert hasher.resumed == 0
    hasher.hashes(text_blocks(4), "m", "c")
    assert hasher.resumed == 1


def test_session_hasher_forgets_the_least_recently_used_session() -> None:
    hasher = PromptHasher(chars_per_block=64, sessions=2)
    hasher.hashes(text_blocks(2), "m", "a")
    hasher.hashes(text_blocks(2), "m", "b")
    hasher.hashes(text_blocks(2), "m", "a")  # a used again: b is now the oldest
    hasher.hashes(text_blocks(2), "m", "c")  # evicts b
    resumed = hasher.resumed
    hasher.hashes(text_blocks(3), "m", "a")
    assert hasher.resumed == resumed + 1
    hasher.hashes(text_blocks(3), "m", "b")
    assert hasher.resumed == resumed + 1


def test_the_scheduler_sizes_each_backend_from_its_cache_config() -> None:
    from fleet.types import EngineMetrics
    from policies.registry import build_policy
    from tests.unit.policies.builders import backend, ctx

    policy = build_policy("lmetric")
    # 16-token blocks x 3 GPU blocks = 48 tokens = 192 characters = 3 index blocks of 64.
    small = backend("small", scraped=EngineMetrics(block_size=16, num_gpu_blocks=3))
    policy.pick(ctx(text_blocks(10)), [small], 0.0)
    index = policy.services.prefix_index
    assert index is not None
    assert index.capacity("small") == 3 and index.backend_blocks("small") == 3
    # The prompt's head survives, its tail was evicted.
    assert index.match(index.hashes(text_blocks(10), "m")).blocks("small") == 3
