"""The simulated engine's KV-cache events: what its block pool records as blocks are cached,
evicted and reset, and that an index built from nothing but those events knows exactly
which prefix the engine's cache holds."""

from __future__ import annotations

import random

from fleet.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from fleet.precise_prefix import PrecisePrefixIndex
from simulator.kv_cache import chain_hashes
from simulator.tokenizer import Tokenizer
from tests.unit.simulator.conftest import CoreHarness

BS = 4  # the unit profile's block size


def test_cached_blocks_are_stored_with_their_parent_and_tokens(tokenizer: Tokenizer) -> None:
    h = CoreHarness(tokenizer, record_kv_events=True, num_gpu_blocks=64)
    prompt = list(range(100, 110))  # 2 full blocks and 2 tokens
    h.request(prompt, max_tokens=1)
    h.run()
    hashes = chain_hashes(prompt, BS)
    assert h.core.pool.take_events() == [BlockStored(hashes, None, prompt[:8], BS, medium="GPU")]
    # Sharing both blocks, the next request caches a third, chained to the second.
    longer = [*prompt[:8], 1, 2, 3, 4, 5]
    h.request(longer, max_tokens=1)
    h.run()
    (event,) = h.core.pool.take_events()
    assert isinstance(event, BlockStored)
    assert event.parent_block_hash == hashes[1]
    assert event.block_hashes == chain_hashes(longer, BS)[2:3]
    assert event.token_ids == [1, 2, 3, 4]
    assert h.core.pool.take_events() == []


def test_evictions_are_removed_and_a_reset_clears(tokenizer: Tokenizer) -> None:
    h = CoreHarness(tokenizer, record_kv_events=True, num_gpu_blocks=4)
    first = list(range(100, 113))  # 3 full blocks cached, 4 blocks used
    h.request(first, max_tokens=1)
    h.run()
    h.core.pool.take_events()
    h.request(list(range(200, 213)), max_tokens=1)  # needs all 4 blocks: evicts the 3
    h.run()
    events = h.core.pool.take_events()
    removed = [x for e in events if isinstance(e, BlockRemoved) for x in e.block_hashes]
    assert sorted(removed) == sorted(chain_hashes(first, BS))
    assert h.core.pool.reset_prefix_cache()
    assert h.core.pool.take_events() == [AllBlocksCleared()]


def test_without_recording_nothing_is_kept(tokenizer: Tokenizer) -> None:
    h = CoreHarness(tokenizer, num_gpu_blocks=64)
    h.request(list(range(100, 120)), max_tokens=2)
    h.run()
    assert h.core.pool.take_events() == []


def test_an_index_fed_the_events_matches_the_engines_own_prefix_lookup(
    tokenizer: Tokenizer,
) -> None:
    """Random shared-prefix traffic through a cache small enough to evict all the time:
    after every step the index's leading blocks equal what the engine would hit."""
    rng = random.Random(5)
    h = CoreHarness(tokenizer, record_kv_events=True, num_gpu_blocks=24)
    index = PrecisePrefixIndex()
    index.reset("e", 0.0, complete=True)
    stems = [[rng.randrange(1000, 2000) for _ in range(12)] for _ in range(4)]
    probes = [stem + [rng.randrange(1000, 2000) for _ in range(8)] for stem in stems]
    compared = 0
    for n in range(60):
        stem = stems[rng.randrange(len(stems))]
        tail = [rng.randrange(1000, 2000) for _ in range(rng.randrange(0, 10))]
        h.request(stem[: rng.randrange(4, 13)] + tail, max_tokens=rng.randrange(1, 6))
        if n % 7 == 6:
            h.run()
        for _ in range(3):
            h.step()
            index.apply("e", h.core.pool.take_events(), h.now)
            for probe in [*probes, *stems]:
                engine_hits = len(h.core.pool.lookup_prefix(chain_hashes(probe, BS)))
                assert index.match(probe).blocks("e") == engine_hits
                compared += engine_hits
    assert compared > 0  # the cache did hold prefixes along the way
    assert index.counters.removed > 0  # and evicted some


def test_an_adapters_blocks_carry_it_and_match_no_base_model_prompt(tokenizer: Tokenizer) -> None:
    """As vLLM's: a LoRA request's events name its adapter (id, name, and the name as each
    block's extra key), so an index fed them does not take them for the base model's blocks
    of the same tokens, which the engine does not hit either."""
    h = CoreHarness(tokenizer, record_kv_events=True, num_gpu_blocks=64)
    prompt = list(range(100, 110))
    req = h.request(prompt, max_tokens=1)
    req.lora, req.lora_id = "sql-lora", 2
    h.run()
    (event,) = h.core.pool.take_events()
    assert isinstance(event, BlockStored)
    assert (event.lora_id, event.lora_name) == (2, "sql-lora")
    assert event.extra_keys == [["sql-lora"], ["sql-lora"]]
    assert len(h.core.pool.lookup_prefix(chain_hashes(prompt, BS))) == 0  # base: no hit
    index = PrecisePrefixIndex()
    index.reset("e", 0.0, complete=True)
    index.apply("e", [event], h.now)
    assert index.counters.stored == 2
    assert index.match(prompt).blocks("e") == 0
    # The base model's own request for the same tokens is cached apart, and matched.
    h.request(prompt, max_tokens=1)
    h.run()
    (base,) = h.core.pool.take_events()
    assert isinstance(base, BlockStored) and base.lora_name is None and base.extra_keys is None
    index.apply("e", [base], h.now)
    assert index.match(prompt).blocks("e") == 2
