"""Assembling the non-streamed answer from stream events, as vLLM 0.32 writes it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from proxy.stream.assembled_answer import AnswerTooLarge, Assembler
from proxy.stream.splice import CHAT, COMPLETIONS, EventBuffer, Splicer, StreamIdentity
from simulator.openai_api import CHAT as SIM_CHAT
from simulator.openai_api import ChunkWriter, ParsedRequest, full_response, sse
from simulator.request import GenerationParams
from tests.support.captures import GOLDEN, golden_events, parsed

CAPTURES = {
    COMPLETIONS: ("completion_stream.txt", "completion.json"),
    CHAT: ("chat_stream.txt", "chat.json"),
}


def expected_body(endpoint: str, *, token_ids: bool = True) -> dict[str, Any]:
    """The captured non-streamed answer, with the id, created and fingerprint of the captured
    stream (the two captures are the same request, made one after the other)."""
    stream_name, body_name = CAPTURES[endpoint]
    body: dict[str, Any] = json.loads((GOLDEN / body_name).read_text())
    first, usage = parsed(golden_events(stream_name)[0]), parsed(golden_events(stream_name)[-2])
    body.update(
        id=first["id"], created=first["created"], system_fingerprint=usage["system_fingerprint"]
    )
    if not token_ids:
        body["choices"][0]["token_ids"] = None
        if endpoint == CHAT:
            body["prompt_token_ids"] = None
        else:
            body["choices"][0]["prompt_token_ids"] = None
    return body


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("token_ids", [True, False])
def test_the_captured_stream_assembles_into_the_captured_answer(
    endpoint: str, token_ids: bool
) -> None:
    a = Assembler(endpoint=endpoint, token_ids=token_ids)
    a.feed((GOLDEN / CAPTURES[endpoint][0]).read_bytes())
    assert a.error() is None
    # Byte for byte: the same keys in the same order, the same nulls (vLLM writes compact JSON).
    assert a.body() == orjson.dumps(expected_body(endpoint, token_ids=token_ids))


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_events_fed_in_any_pieces_give_the_same_body(endpoint: str) -> None:
    raw = (GOLDEN / CAPTURES[endpoint][0]).read_bytes()
    a = Assembler(endpoint=endpoint, token_ids=True)
    for i in range(0, len(raw), 29):
        a.feed(raw[i : i + 29])
    a.feed(b"")
    assert a.body() == orjson.dumps(expected_body(endpoint))


def continuation(
    events: list[dict[str, Any]], usage: dict[str, Any], prompt: list[int], before: list[int]
) -> bytes:
    """Server B's completions stream for the rest of a request cut after `before` (ids)."""
    out = []
    for n, ev in enumerate(events):
        c = ev["choices"][0]
        choice = {
            "index": 0,
            "text": c["delta"].get("content", "") if "delta" in c else c["text"],
            "logprobs": None,
            "finish_reason": c["finish_reason"],
            "stop_reason": c.get("stop_reason"),
            "prompt_token_ids": prompt + before if n == 0 else None,
            "token_ids": c["token_ids"],
        }
        out.append(
            sse(
                {
                    "id": "cmpl-b",
                    "object": "text_completion",
                    "created": 1,
                    "model": "tiny",
                    "choices": [choice],
                }
            )
        )
    k, use = len(before), usage["usage"]
    b_usage = {
        "prompt_tokens": use["prompt_tokens"] + k,
        "total_tokens": use["total_tokens"],
        "completion_tokens": use["completion_tokens"] - k,
    }
    out.append(
        sse(
            {
                "id": "cmpl-b",
                "object": "text_completion",
                "created": 1,
                "model": "tiny",
                "choices": [],
                "usage": b_usage,
                "system_fingerprint": usage["system_fingerprint"],
            }
        )
    )
    return b"".join(out) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("token_ids", [True, False])
@pytest.mark.parametrize("k", [1, 7])
def test_assembly_across_a_splice_gives_the_uninterrupted_answer(
    endpoint: str, token_ids: bool, k: int
) -> None:
    """First leg: the captured stream's first events as vLLM wrote them; then the splicer's
    rewrite of a continuation. The body is the captured non-streamed answer: the text, the token
    ids and the usage of the whole request."""
    events = golden_events(CAPTURES[endpoint][0])
    head = 1 if endpoint == CHAT else 0  # chat opens with the role event
    first = parsed(events[0])
    prompt = (
        first["prompt_token_ids"] if endpoint == CHAT else first["choices"][0]["prompt_token_ids"]
    )
    tokens = [parsed(e) for e in events[head : head + 12]]
    before = [i for ev in tokens[:k] for i in ev["choices"][0]["token_ids"]]
    splicer = Splicer(
        endpoint=endpoint,
        identity=StreamIdentity.from_event(events[0]),
        prompt_tokens=len(prompt),
        tokens_before=k,
        include_usage=True,  # the proxy asked it of every leg
        continuous_usage=False,
        token_ids=True,  # so that the assembled answer has every id
    )
    a = Assembler(endpoint=endpoint, token_ids=token_ids)
    a.feed(b"".join(events[: head + k]))
    a.feed(splicer.rewrite(continuation(tokens[k:], parsed(events[-2]), prompt, before)))
    assert a.body() == orjson.dumps(expected_body(endpoint, token_ids=token_ids))


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_a_stream_past_max_bytes_is_refused_and_one_at_it_assembles(endpoint: str) -> None:
    raw = (GOLDEN / CAPTURES[endpoint][0]).read_bytes()
    at_cap = Assembler(endpoint=endpoint, token_ids=True, max_bytes=len(raw))
    for i in range(0, len(raw), 100):
        at_cap.feed(raw[i : i + 100])
    assert at_cap.body() == orjson.dumps(expected_body(endpoint))
    over = Assembler(endpoint=endpoint, token_ids=True, max_bytes=len(raw) - 1)
    over.feed(raw[:-1])
    with pytest.raises(AnswerTooLarge, match=rf"{len(raw) - 1}-byte cap"):
        over.feed(raw[-1:])


def test_an_error_event_is_reported() -> None:
    events = golden_events("completion_stream.txt")
    error = {"error": {"message": "boom", "type": "upstream_error", "param": None, "code": 502}}
    a = Assembler(endpoint=COMPLETIONS, token_ids=False)
    a.feed(b"".join(events[:3]) + sse(error) + b"data: [DONE]\n\n")
    assert a.error() == error
    with pytest.raises(ValueError):
        Assembler(endpoint=CHAT, token_ids=False).body()
    with pytest.raises(ValueError):
        Assembler(endpoint="embeddings", token_ids=False)


@pytest.mark.parametrize("token_ids", [True, False])
def test_chat_ending_on_a_stop_token_matches_the_simulators_answer(token_ids: bool) -> None:
    """An empty final delta, an integer stop_reason, a held-back token: the body equals what
    the simulator answers for the same request with stream=false."""
    prompt = [1, 40, 41, 42]
    steps: list[tuple[list[int], str, str | None, int | None]] = [
        ([500], "Hi", None, None),
        ([501], "", None, None),
        ([502, 503], " th\u00e9re\n", None, None),
        ([2], "", "stop", 2),
    ]
    p = ParsedRequest(
        kind=SIM_CHAT,
        model="sim",
        prompt_ids=prompt,
        params=GenerationParams(max_tokens=8),
        stream=True,
        include_usage=True,
        continuous_usage=False,
        return_token_ids=True,
        kv_transfer_params=None,
    )
    w = ChunkWriter(p, "chatcmpl-1", prompt)
    opening = w.opening()
    assert opening is not None
    stream = [sse(opening)] + [w.token_bytes(*s) for s in steps]
    final = w.final_usage()
    assert final is not None
    stream += [sse(final), b"data: [DONE]\n\n"]
    a = Assembler(endpoint=CHAT, token_ids=token_ids)
    a.feed(b"".join(stream))

    req = SimpleNamespace(
        prompt_ids=prompt,
        output_ids=[t for ids, *_ in steps for t in ids],
        output_text="".join(s[1] for s in steps),
        finish_reason="stop",
        stop_reason=2,
    )
    p.return_token_ids = token_ids
    want = full_response(p, "chatcmpl-1", w.created, req, None)  # type: ignore[arg-type]
    assert a.body() == orjson.dumps(want)
    assert [len(EventBuffer().feed(e)) for e in stream] == [1] * len(stream)
