"""The prefix index's shortcuts (resumed hashes, the last-block-first match, skipped repeat
records) change no answer: random sequences of prompts and operations give the same hashes as
hashing from scratch, and the same matches, sizes and LRU order (so the same evictions later)
as the plain per-block index below, which touches every block of every record."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.prefix import PrefixIndex, PromptHasher, block_hashes

CPB = 4  # small blocks: short texts of many blocks, prompts sharing heads
BACKENDS = ("A", "B", "C")


class PlainIndex:
    """The index without shortcuts: binary search per owner, every block touched per record."""

    def __init__(self, capacity: int) -> None:
        self.default_capacity = capacity
        self.blocks: dict[str, OrderedDict[int, None]] = {}
        self.capacities: dict[str, int] = {}
        self.owners: dict[int, set[str]] = {}
        self.size = 0

    def match(self, hashes: list[int]) -> dict[str, int]:
        matched: dict[str, int] = {}
        if not hashes:
            return matched
        for backend in self.owners.get(hashes[0], ()):
            lru = self.blocks[backend]
            lo, hi = 1, len(hashes)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if hashes[mid - 1] in lru:
                    lo = mid
                else:
                    hi = mid - 1
            matched[backend] = lo
        return matched

    def record(self, backend: str, hashes: list[int]) -> None:
        lru = self.blocks.setdefault(backend, OrderedDict())
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                self.size += 1
                self.owners.setdefault(h, set()).add(backend)
        self.evict(backend)

    def set_capacity(self, backend: str, blocks: int) -> None:
        self.capacities[backend] = max(1, blocks)
        if backend in self.blocks:
            self.evict(backend)

    def remove(self, backend: str) -> None:
        lru = self.blocks.pop(backend, OrderedDict())
        self.capacities.pop(backend, None)
        for h in lru:
            self.drop(h, backend)
        self.size -= len(lru)

    def evict(self, backend: str) -> None:
        lru = self.blocks[backend]
        while len(lru) > self.capacities.get(backend, self.default_capacity):
            h, _ = lru.popitem(last=False)
            self.size -= 1
            self.drop(h, backend)

    def drop(self, h: int, backend: str) -> None:
        owners = self.owners[h]
        owners.discard(backend)
        if not owners:
            del self.owners[h]


def lru_orders(index: PrefixIndex) -> dict[str, list[int]]:
    return {b: list(lru) for b, lru in index._blocks.items()}


# A prompt: blocks drawn from a few texts (so prompts share heads and extend each other),
# then maybe a partial tail; "é" is two UTF-8 bytes, so some blocks end inside a character.
block = st.sampled_from(["aaaa", "bbbb", "abab", "é€"])
prompt = st.builds(
    lambda blocks, tail: "".join(blocks) + tail,
    st.lists(block, max_size=8),
    st.sampled_from(["", "x", "yz"]),
)
# Records pick from a few prompts, so that prompts come again, to the same backend or not.
record = st.tuples(
    st.just("record"), st.sampled_from(BACKENDS), st.integers(0, 4), st.sampled_from([None, "s"])
)
operation = st.one_of(
    record,
    record,
    record,
    st.tuples(st.just("capacity"), st.sampled_from(BACKENDS), st.integers(1, 12)),
    st.tuples(st.just("remove"), st.sampled_from(BACKENDS)),
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(prompt, min_size=5, max_size=5),
    st.lists(operation, max_size=40),
    st.integers(3, 20),
)
def test_shortcuts_change_no_hash_match_or_eviction(
    prompts: list[str], ops: list[tuple], capacity: int
) -> None:
    index = PrefixIndex(chars_per_block=CPB, default_capacity_blocks=capacity)
    plain = PlainIndex(capacity)
    seen: list[list[int]] = []
    for op in ops:
        if op[0] == "record":
            _, backend, which, session = op
            text = prompts[which]
            hashes = index.hashes(text, "m", session)
            assert hashes == block_hashes(text, "m", CPB)
            seen.append(hashes)
            assert dict(index.match(hashes).matched) == plain.match(hashes)
            index.record(backend, hashes)
            plain.record(backend, hashes)
        elif op[0] == "capacity":
            index.set_capacity(op[1], op[2])
            plain.set_capacity(op[1], op[2])
        else:
            index.remove_backend(op[1])
            plain.remove(op[1])
        assert index.size() == plain.size
        # The same blocks in the same eviction order per backend (what later matches hang on).
        assert lru_orders(index) == {b: list(lru) for b, lru in plain.blocks.items()}
        for hashes in seen:
            assert dict(index.match(hashes).matched) == plain.match(hashes)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(BACKENDS), st.lists(st.integers(0, 9), max_size=8)),
        max_size=30,
    ),
    st.integers(3, 12),
)
def test_any_blocks_are_recorded_in_the_same_order(
    records: list[tuple[str, list[int]]], capacity: int
) -> None:
    """`record` keeps the plain index's order even for block lists no chained hashing makes
    (a block repeated, a backend holding a later block but not an earlier one): its shortcut
    for a held prefix falls back to block by block."""
    index = PrefixIndex(chars_per_block=CPB, default_capacity_blocks=capacity)
    plain = PlainIndex(capacity)
    for backend, hashes in records:
        index.record(backend, hashes)
        plain.record(backend, hashes)
        assert lru_orders(index) == {b: list(lru) for b, lru in plain.blocks.items()}
        assert index.size() == plain.size


def test_resume_points_are_bounded_by_the_blocks_they_keep() -> None:
    hasher = PromptHasher(chars_per_block=CPB, sessions=100, max_blocks=5)
    first, second = "a" * 12, "b" * 12  # 3 blocks each
    hasher.hashes(first, "m", "s1")
    hasher.hashes(second, "m", "s2")  # 6 blocks kept would be over 5: s1's point goes
    hasher.hashes(second, "m", "s2")
    assert hasher.resumed == 1
    hasher.hashes(first + "cccc", "m", "s1")
    assert hasher.resumed == 1
    # A prompt over the whole budget is hashed but not kept, and pushes nothing else out.
    hasher.hashes("d" * 24, "m", "s3")
    hasher.hashes("d" * 28, "m", "s3")
    assert hasher.resumed == 1
    hasher.hashes(first + "cccc" + "eeee", "m", "s1")
    assert hasher.resumed == 2


def test_a_sessionless_prompt_resumes_from_the_last_one_with_its_first_block() -> None:
    hasher = PromptHasher(chars_per_block=CPB)
    turn1, turn2 = "aaaabbbb", "aaaabbbbcccc"
    for text in (turn1, turn2, turn2, "aaaadddd", turn2):
        assert hasher.hashes(text, "m") == block_hashes(text, "m", CPB)
    # turn2 extends turn1 and repeats itself; "aaaadddd" shares only the first block, and
    # turn2 after it is hashed from scratch.
    assert hasher.resumed == 2
