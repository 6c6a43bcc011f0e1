import itertools
import math

import orjson

from bench.mooncake import MOONCAKE_BLOCK_TOKENS, build_workload, parse_trace
from bench.tracegen import conversation_trace


def test_trace_lines_are_valid_mooncake_and_sorted() -> None:
    lines = conversation_trace(conversations=8, seed=3)
    entries = parse_trace([orjson.dumps(x) for x in lines])
    assert [e.timestamp_ms for e in entries] == sorted(e.timestamp_ms for e in entries)
    for e in entries:
        assert len(e.hash_ids) == math.ceil(e.input_length / MOONCAKE_BLOCK_TOKENS)
        assert e.hash_ids[:2] == (0, 1)  # the shared system prompt


def test_each_turn_resends_the_conversation_so_far() -> None:
    lines = conversation_trace(conversations=1, turns=(4, 4), system_blocks=1, seed=5)
    prompts = [
        s.turns[0].user
        for s in build_workload(parse_trace([orjson.dumps(x) for x in lines])).sessions
    ]
    assert len(prompts) == 4
    for earlier, later in itertools.pairwise(prompts):
        assert later.startswith(earlier)  # synthesized text: the whole earlier prompt is a prefix
        assert len(later) > len(earlier)


def test_conversations_share_only_the_system_blocks() -> None:
    lines = conversation_trace(
        conversations=6, turns=(1, 1), system_blocks=2, user_tokens=(600, 600), seed=1
    )
    tails = [tuple(x["hash_ids"])[2:] for x in lines]  # type: ignore[arg-type]
    assert len(set(tails)) == len(tails) and all(tails)
