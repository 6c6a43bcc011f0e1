"""The per-chunk tracker, fed with real vLLM 0.32 streams cut at every possible place."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.stream.token_ledger import EventAligner, TokenLedger

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
