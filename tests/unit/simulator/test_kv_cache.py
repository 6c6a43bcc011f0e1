import pytest

from simulator.kv_cache import BlockPool, chain_hashes


def test_chain_hashes_cover_full_blocks_and_depend_on_the_prefix() -> None:
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(a) == 2  # the ninth token is not a full block
    b = chain_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[1] != b[1]  # same second block, different parent
    assert chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 4, a)[:2] == a


def test_allocate_until_empty_then_free_returns_blocks() -> None:
    pool = BlockPool(4)
    got = pool.allocate(3)
    assert got is not None and len(got) == 3
    assert pool.allocate(2) is None
    assert pool.usage() == pytest.approx(0.75)
    pool.free(got)
    assert pool.num_free == 4 and pool.usage() == 0.0


def test_cached_unreferenced_blocks_count_as_free_and_are_reused_by_prefix() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    assert blocks is not None
    hashes = chain_hashes(list(range(8)), 4)
    for b, h in zip(blocks, hashes, strict=True):
        pool.cache(b, h)
    pool.free(blocks)
    assert pool.usage() == 0.0
    assert pool.lookup_prefix(hashes) == blocks
    pool.touch(blocks)
    assert pool.num_free == 2 and all(pool.ref_count(b) == 1 for b in blocks)


def test_eviction_takes_least_recently_freed_first_and_tail_blocks_first() -> None:
    pool = BlockPool(4)
    first = pool.allocate(2)
    second = pool.allocate(2)
    assert first is not None and second is not None
    h1 = chain_hashes([1] * 8, 4)
    h2 = chain_hashes([2] * 8, 4)
    for b, h in zip(first + second, h1 + h2, strict=True):
        pool.cache(b, h)
    pool.free(first)
    pool.free(second)
    got = pool.allocate(1)
    # The first request's last block goes first: its leading block stays reusable.
    assert got == [first[1]]
    assert pool.lookup_prefix(h1) == [first[0]]
    assert pool.lookup_prefix(h2) == second


def test_shared_block_stays_until_every_holder_frees_it() -> None:
    pool = BlockPool(2)
    blocks = pool.allocate(1)
    assert blocks is not None
    pool.cache(blocks[0], 123)
    pool.touch(blocks)
    pool.free(blocks)
    assert pool.num_free == 1
    pool.free(blocks)
    assert pool.num_free == 2
