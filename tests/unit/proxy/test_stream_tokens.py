"""The per-chunk tracker, fed with real vLLM 0.32 streams cut at every possible place."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.stream.token_ledger import EventAligner, EventTooLarge, TokenLedger

GOLDEN = Path(__file__).parents[2] / "golden" / "vllm-0.32"
CAPTURES = {
    "completions": GOLDEN / "completion_stream.txt",
    "chat/completions": GOLDEN / "chat_stream.txt",
}


def events_of(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


def without_ids(event: bytes) -> Any:
    """What the event is without the fields only `return_token_ids` adds."""
    if event == b"data: [DONE]":
        return "[DONE]"
    data = orjson.loads(event[6:])
    data.pop("prompt_token_ids", None)
    data.pop("prompt_text", None)
    for c in data.get("choices", []):
        c.pop("token_ids", None)
        c.pop("prompt_token_ids", None)
    return data


def chunked(raw: bytes, rng: random.Random) -> list[bytes]:
    out, i = [], 0
    while i < len(raw):
        n = rng.randint(1, 300)
        out.append(raw[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("endpoint", list(CAPTURES))
@pytest.mark.parametrize("seed", range(20))
def test_ids_are_recorded_and_stripped_however_the_stream_is_cut(endpoint: str, seed: int) -> None:
    raw = CAPTURES[endpoint].read_bytes()
    ledger = TokenLedger()
    ledger.start_leg(strip=True, chat=endpoint == "chat/completions")
    passed = b"".join(ledger.feed(c) for c in chunked(raw, random.Random(seed)))
    assert ledger.events.tail == b""
    expected_ids = [
        t
        for e in events_of(raw)
        if e != b"data: [DONE]"
        for c in orjson.loads(e[6:]).get("choices", [])
        for t in c.get("token_ids") or []
    ]
    assert ledger.generated == expected_ids and len(expected_ids) == 12
    first = orjson.loads(events_of(raw)[0][6:])
    prompt = first.get("prompt_token_ids") or first["choices"][0]["prompt_token_ids"]
    assert ledger.prompt_ids() == prompt
    # Byte-level stripping leaves exactly the events without the id fields, still valid JSON.
    assert [without_ids(e) for e in events_of(passed)] == [without_ids(e) for e in events_of(raw)]
    assert b"token_ids" not in passed and b"prompt_text" not in passed
    assert ledger.done and ledger.finished and ledger.usage_seen and not ledger.error_event
    assert ledger.sent and ledger.token_events == 12
    assert ledger.safe() == 12 and ledger.not_movable == ""
    assert ledger.first_event == events_of(raw)[0]


@pytest.mark.parametrize("endpoint", list(CAPTURES))
def test_without_strip_the_bytes_pass_unchanged(endpoint: str) -> None:
    raw = CAPTURES[endpoint].read_bytes()
    ledger = TokenLedger()
    ledger.start_leg(strip=False, chat=endpoint == "chat/completions")
    assert b"".join(ledger.feed(c) for c in chunked(raw, random.Random(1))) == raw
    assert len(ledger.generated) == 12


def completion_event(text: str, ids: list[int], finish: str | None = None) -> bytes:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": ids,
    }
    return b"data: " + orjson.dumps({"id": "c", "choices": [choice]}) + b"\n\n"


def test_the_safe_cut_is_after_the_last_event_with_text() -> None:
    ledger = TokenLedger()
    ledger.start_leg(strip=True, chat=False)
    ledger.feed(completion_event("Hello", [10]))
    ledger.feed(completion_event(" wor", [11, 12]))
    # Half of a multi-byte character: vLLM sends the token with no text yet.
    ledger.feed(completion_event("", [13]))
    assert ledger.generated == [10, 11, 12, 13]
    assert ledger.safe() == 2 and not ledger.finished
    ledger.rewind_to_safe()
    assert ledger.generated == [10, 11, 12]
    ledger.feed(completion_event(" world", [14], finish="length"))
    assert ledger.safe() == 3 and ledger.finished and not ledger.usage_seen


def test_a_chat_delta_that_is_not_plain_content_makes_the_stream_unmovable() -> None:
    ledger = TokenLedger()
    ledger.start_leg(strip=True, chat=True)
    choice = {"index": 0, "delta": {"reasoning": "hmm"}, "finish_reason": None, "token_ids": [5]}
    event = {"id": "c", "choices": [choice]}
    ledger.feed(b"data: " + orjson.dumps(event) + b"\n\n")
    assert ledger.not_movable == "structured_delta"


def test_an_error_event_is_noticed() -> None:
    ledger = TokenLedger()
    ledger.start_leg(strip=True, chat=False)
    ledger.feed(b'data: {"error": {"message": "engine dead", "code": 500}}\n\n')
    assert ledger.error_event and not ledger.done


def test_the_aligner_holds_a_partial_event_back() -> None:
    a = EventAligner()
    assert a.feed(b"data: {1}\n\ndata: {2") == b"data: {1}\n\n"
    assert a.feed(b"}\n") == b""
    assert a.feed(b"\ndata: [DONE]\n\n") == b"data: {2}\n\ndata: [DONE]\n\n"
    assert a.tail == b""


# --- line ends other than LF (SSE allows CRLF, LF and CR) and the cap on one event

LINE_ENDS = {"crlf": b"\r\n", "cr": b"\r"}


def reframed(raw: bytes, line_end: bytes) -> bytes:
    return raw.replace(b"\n", line_end)


@pytest.mark.parametrize("framing", list(LINE_ENDS))
@pytest.mark.parametrize("endpoint", list(CAPTURES))
@pytest.mark.parametrize("seed", range(10))
def test_crlf_and_cr_streams_are_tracked_as_their_lf_twin(
    framing: str, endpoint: str, seed: int
) -> None:
    raw = CAPTURES[endpoint].read_bytes()
    chat = endpoint == "chat/completions"
    twin = TokenLedger()
    twin.start_leg(strip=True, chat=chat)
    expected = twin.feed(raw)
    ledger = TokenLedger()
    ledger.start_leg(strip=True, chat=chat)
    cr_raw = reframed(raw, LINE_ENDS[framing])
    # Cut anywhere, CRLF pairs included: whole LF-framed events, the same as from the twin.
    passed = [ledger.feed(c) for c in chunked(cr_raw, random.Random(seed))]
    assert all(p.endswith(b"\n\n") and b"\r" not in p for p in passed if p)
    assert b"".join(passed) == expected
    assert ledger.generated == twin.generated and len(ledger.generated) == 12
    assert ledger.prompt_ids() == twin.prompt_ids()
    assert ledger.done and ledger.finished and ledger.usage_seen and ledger.events.tail == b""
    assert ledger.first_event == twin.first_event and ledger.safe() == 12


@pytest.mark.parametrize("framing", list(LINE_ENDS))
def test_the_aligner_reframes_wherever_a_crlf_stream_is_cut(framing: str) -> None:
    lf = b'data: {"a":1}\n\n: keep-alive\n\ndata: {"b":\ndata: 2}\n\ndata: [DONE]\n\n'
    raw = reframed(lf, LINE_ENDS[framing])
    for i in range(len(raw) + 1):
        for j in range(i, len(raw) + 1):
            a = EventAligner()
            out = a.feed(raw[:i]) + a.feed(raw[i:j]) + a.feed(raw[j:])
            assert out == lf, (i, j)
            assert a.tail == b""


def test_mixed_line_ends_each_end_a_line() -> None:
    a = EventAligner()
    assert a.feed(b"data: 1\r\n\ndata: 2\n\r\ndata: 3\r\rdata: 4\r") == (
        b"data: 1\n\ndata: 2\n\ndata: 3\n\n"
    )
    # The CR ended the line; the LF after it is its pair, not a blank line.
    assert a.feed(b"\n") == b""
    assert a.feed(b"\n") == b"data: 4\n\n"


def test_an_lf_chunk_after_a_partial_event_joins_it() -> None:
    a = EventAligner()
    assert a.feed(b"data: 1\n") == b""
    assert a.pending and a.tail == b"data: 1\n"
    assert a.feed(b"\ndata: 2\n\n") == b"data: 1\n\ndata: 2\n\n"
    assert not a.pending


def test_an_event_past_the_cap_fails_and_frees_its_bytes() -> None:
    a = EventAligner(max_event_bytes=1000)
    assert a.feed(b"data: " + b"x" * 988 + b"\n\n") == b"data: " + b"x" * 988 + b"\n\n"
    assert a.feed(b"data: " + b"y" * 500) == b""
    with pytest.raises(EventTooLarge, match="max_sse_event_bytes"):
        a.feed(b"y" * 600)
    assert a.tail == b"" and not a.pending
    # A whole event that fits, however it is cut, passes.
    a = EventAligner(max_event_bytes=1000)
    event = b"data: " + b"z" * 990 + b"\n\n"
    assert b"".join(a.feed(event[i : i + 7]) for i in range(0, len(event), 7)) == event


def test_the_ledger_applies_the_cap_it_is_given() -> None:
    ledger = TokenLedger()
    ledger.start_leg(strip=True, chat=False)
    ledger.events.max_event_bytes = 4096
    with pytest.raises(EventTooLarge):
        for _ in range(10):
            ledger.feed(b"data: " + b"x" * 1000)


@pytest.mark.parametrize("framing", ["lf", "crlf"])
def test_a_large_unfinished_event_is_buffered_in_linear_time(framing: str) -> None:
    """16 MiB without an event end, in 1 KiB chunks: joined once, not copied per chunk (which
    would copy some 128 GiB)."""
    piece = b"x" * 1023 + (b"\r" if framing == "crlf" else b"y")
    for make in (EventAligner, TokenLedger):
        feeder = make()
        if isinstance(feeder, TokenLedger):
            feeder.start_leg(strip=True, chat=False)
            feeder.events.max_event_bytes = 32 << 20
        else:
            feeder.max_event_bytes = 32 << 20
        began = time.perf_counter()
        assert feeder.feed(b"data: ") == b""
        for _ in range(16 * 1024):
            assert feeder.feed(piece) == b""
        out = feeder.feed(b"\n\n")
        assert len(out) > 16 << 20 and out.endswith(b"\n\n")
        assert time.perf_counter() - began < 5


@pytest.mark.parametrize("seed", range(30))
def test_random_line_ends_and_cuts_give_the_lf_stream(seed: int) -> None:
    rng = random.Random(seed)
    lines = [
        [f'data: {{"n":{e},"l":{i}}}'.encode() for i in range(rng.randint(1, 3))] for e in range(40)
    ]
    raw = b""
    for event in lines:
        for line in [*event, b""]:
            # An empty line's LF right after a CR would be that CR's pair, not a blank line.
            ends = [b"\r\n", b"\r"] if not line and raw.endswith(b"\r") else [b"\r\n", b"\n", b"\r"]
            raw += line + rng.choice(ends)
    lf = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    a = EventAligner()
    assert b"".join(a.feed(c) for c in chunked(raw, rng)) == lf
