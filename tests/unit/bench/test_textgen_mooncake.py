import pytest

from bench.mooncake import MOONCAKE_BLOCK_TOKENS, TraceError, build_workload, parse_trace
from bench.textgen import CHARS_PER_TOKEN, BlockText, estimate_tokens, filler

BLOCK_CHARS = MOONCAKE_BLOCK_TOKENS * CHARS_PER_TOKEN


def test_filler_has_the_asked_token_length_and_is_deterministic() -> None:
    for n in (0, 1, 7, 512, 3000):
        text = filler("seed", n)
        assert len(text) == n * CHARS_PER_TOKEN
        assert estimate_tokens(text) == n
    assert filler("a", 100) == filler("a", 100)
    assert filler("a", 100) != filler("b", 100)


def test_filler_is_words_not_noise() -> None:
    words = filler("x", 400).split()
    # ~4.5 characters per word and space: a real tokenizer sees about a token per word.
    assert 250 < len(words) < 500
    assert all(w.isalpha() for w in words[:-1])


def test_block_prompt_takes_leading_blocks_and_pads_past_them() -> None:
    blocks = BlockText(block_tokens=8)
    assert blocks.prompt([1, 2], 16) == blocks.block(1) + blocks.block(2)
    assert blocks.prompt([1, 2], 12) == blocks.block(1) + blocks.block(2)[:16]
    longer = blocks.prompt([1], 20)
    assert longer.startswith(blocks.block(1)) and len(longer) == 80


TRACE = """\
{"timestamp": 1000, "input_length": 1200, "output_length": 10, "hash_ids": [1, 2, 3]}

{"timestamp": 1500, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 4]}
{"timestamp": 3000, "input_length": 600, "output_length": 7, "hash_ids": [1, 5]}
{"timestamp": 3000, "input_length": 300, "output_length": 7, "hash_ids": [9]}
"""


def test_parse_trace_reads_fields_and_skips_blank_lines() -> None:
    entries = parse_trace(TRACE.splitlines())
    assert [e.timestamp_ms for e in entries] == [1000, 1500, 3000, 3000]
    assert entries[1].input_length == 1100 and entries[1].output_length == 5
    assert entries[0].hash_ids == (1, 2, 3)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 1, "output_length": 3}', "line 2"),
        ("not json", "line 2"),
        ('{"timestamp": 1, "input_length": 0, "output_length": 3}', "positive"),
    ],
)
def test_parse_trace_names_the_bad_line(line: str, message: str) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}'
    with pytest.raises(TraceError, match=message):
        parse_trace([good, line])


def test_equal_hash_ids_give_equal_text_and_the_rest_differs() -> None:
    w = build_workload(parse_trace(TRACE.splitlines()))
    p = [s.turns[0].user for s in w.sessions]
    assert [len(x) for x in p] == [n * CHARS_PER_TOKEN for n in (1200, 1100, 600, 300)]
    # Requests 0 and 1 share blocks 1, 2: exactly 2 blocks of common prefix.
    shared = 2 * BLOCK_CHARS
    assert p[0][:shared] == p[1][:shared]
    assert p[0][shared : shared + 64] != p[1][shared : shared + 64]
    # Request 2 shares only block 1 with both; request 3 shares nothing.
    assert p[2][:BLOCK_CHARS] == p[0][:BLOCK_CHARS]
    assert p[2][BLOCK_CHARS : BLOCK_CHARS + 64] != p[0][BLOCK_CHARS : BLOCK_CHARS + 64]
    assert p[3][:64] != p[0][:64]


def test_arrivals_follow_timestamps_scaled_by_speed_and_caps_apply() -> None:
    entries = parse_trace(TRACE.splitlines())
    w = build_workload(
        entries, speed=2.0, max_requests=3, max_input_tokens=700, max_output_tokens=6
    )
    assert [s.arrival_s for s in w.sessions] == [0.0, 0.25, 1.0]
    assert [len(s.turns[0].user) for s in w.sessions] == [2800, 2800, 2400]
    assert [s.turns[0].max_tokens for s in w.sessions] == [6, 5, 6]


def test_salt_changes_text_but_keeps_the_sharing() -> None:
    entries = parse_trace(TRACE.splitlines())
    a = [s.turns[0].user for s in build_workload(entries, salt="~r0").sessions]
    b = [s.turns[0].user for s in build_workload(entries, salt="~r1").sessions]
    assert a[0][:64] != b[0][:64]
    assert b[0][: 2 * BLOCK_CHARS] == b[1][: 2 * BLOCK_CHARS]
    assert [len(x) for x in a] == [len(x) for x in b]


def test_the_simulator_tokenizes_filler_at_about_four_chars_per_token() -> None:
    # The lengths a trace asks for are the lengths the engine sees (docs/simulator.md).
    from simulator.tokenizer import Tokenizer

    text = filler("ratio", 5000)
    ratio = len(text) / len(Tokenizer().encode(text))
    assert 3.8 < ratio < 4.2


def test_lines_without_hash_ids_share_nothing() -> None:
    lines = ['{"timestamp": 0, "input_length": 100, "output_length": 1}'] * 2
    a, b = (s.turns[0].user for s in build_workload(parse_trace(lines)).sessions)
    assert len(a) == len(b) == 400 and a[:64] != b[:64]
