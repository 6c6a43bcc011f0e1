"""How a stream ends when its backend does not end it as it should, end to end on real sockets:
a backend that breaks after its last token, one cut exactly at the request's max_tokens, and
one that ignores "stream": true and answers JSON. The client gets a complete answer, once, and
the proxy counts it as the 200 it is."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from simulator.fleet import start_fleet
from tests.support.fake_backend import FakeBackend, Seen
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "fake-model"
SIM_MODEL = "sim-llama-8b"
PROMPT_IDS = [11, 12, 13]
TOKENS = 5
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def text_of(i: int) -> str:
    return f" t{i}"


@dataclass
class EndingEngine(FakeBackend):
    """A vLLM-shaped engine whose answers end as `ending` says:
    - "done": as vLLM ends them (the last token's finish_reason, usage when asked, [DONE]);
    - "break_after_last": the last token with its finish_reason, then the connection drops;
    - "cut_at_limit": every token up to max_tokens without a finish_reason, then it drops;
    - "json": a whole JSON answer, whatever "stream" asked."""

    ending: str = "done"

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(Seen(request.path, dict(request.headers), body))
        chat = request.path.endswith("chat/completions")
        if self.ending == "json" or not body.get("stream"):
            return web.json_response(whole_answer(chat))
        ids = body.get("return_token_ids") is True
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        envelope = {
            "id": "cmpl-end",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": MODEL,
        }
        if chat:
            opening: dict[str, Any] = {
                **envelope,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""},
                     "logprobs": None, "finish_reason": None}
                ],
            }  # fmt: skip
            if ids:
                opening.update(prompt_token_ids=PROMPT_IDS, prompt_text=None)
            await resp.write(event(opening))
        finishes = self.ending != "cut_at_limit"
        for i in range(TOKENS):
            finish = "length" if finishes and i == TOKENS - 1 else None
            choice: dict[str, Any]
            if chat:
                choice = {"index": 0, "delta": {"content": text_of(i)}, "logprobs": None,
                          "finish_reason": finish}  # fmt: skip
                if finish is not None:
                    choice["stop_reason"] = None
            else:
                choice = {"index": 0, "text": text_of(i), "logprobs": None,
                          "finish_reason": finish, "stop_reason": None}  # fmt: skip
                if ids:
                    choice["prompt_token_ids"] = PROMPT_IDS if i == 0 else None
            if ids:
                choice["token_ids"] = [100 + i]
            await resp.write(event({**envelope, "choices": [choice]}))
        if self.ending != "done":
            assert request.transport is not None
            request.transport.abort()
            return resp
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 3, "total_tokens": 3 + TOKENS, "completion_tokens": TOKENS}
            await resp.write(event({**envelope, "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def whole_answer(chat: bool) -> dict[str, Any]:
    text = "".join(text_of(i) for i in range(TOKENS))
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text}} if chat
        else {"index": 0, "text": text}
    )  # fmt: skip
    choice["finish_reason"] = "length"
    return {
        "id": "cmpl-json",
        "object": "chat.completion" if chat else "text_completion",
        "created": 1,
        "model": MODEL,
        "choices": [choice],
        "usage": {"prompt_tokens": 3, "total_tokens": 3 + TOKENS, "completion_tokens": TOKENS},
    }


def request_body(path: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": TOKENS, "stream": stream, **extra}
    if path == COMPLETIONS:
        body["prompt"] = "hello"
    else:
        body["messages"] = [{"role": "user", "content": "hello"}]
    return body


@dataclass
class Answer:
    status: int
    content_type: str
    events: list[dict[str, Any]]
    done: int  # [DONE] events


def parse_stream(raw: bytes) -> tuple[list[dict[str, Any]], int]:
    events, done = [], 0
    for block in raw.split(b"\n\n"):
        if not block.startswith(b"data: "):
            continue
        if block == b"data: [DONE]":
            done += 1
        else:
            events.append(json.loads(block[6:]))
    return events, done


def texts(events: list[dict[str, Any]]) -> list[str]:
    return [
        c.get("text", (c.get("delta") or {}).get("content", ""))
        for e in events
        for c in e.get("choices", [])
    ]


def finishes(events: list[dict[str, Any]]) -> list[str]:
    return [c["finish_reason"] for e in events for c in e.get("choices", []) if c["finish_reason"]]


async def served(
    engine: EndingEngine, tmp_path: Path, path: str, body: dict[str, Any], **settings: Any
) -> tuple[Answer, dict[str, Any], float | None]:
    """One request through a proxy in front of `engine`: the client's answer, its request log
    line and the proxy's count of it as a 200."""
    log_file = tmp_path / "requests.jsonl"
    config = fast_settings([engine.url], request_log="json", request_log_file=log_file, **settings)
    async with running_proxy(config) as (url, app), httpx.AsyncClient(base_url=url) as c:
        r = await c.post(path, json=body)
        events, done = parse_stream(r.content) if body.get("stream") else ([], 0)
        answer = Answer(r.status_code, r.headers["content-type"], events, done)
        if not body.get("stream"):
            answer.events = [r.json()]

        def logged() -> dict[str, Any] | None:
            lines = log_file.read_bytes().splitlines() if log_file.exists() else []
            return orjson.loads(lines[0]) if lines else None

        line = await eventually(logged, what="the request's log line")
        labels = {"endpoint": path.removeprefix("/v1/"), "model": MODEL, "status": "200"}
        counted = app.core.prom.get_sample_value("fleet_proxy_requests_total", labels)
        errors = {**labels, "status": "500"}
        assert app.core.prom.get_sample_value("fleet_proxy_requests_total", errors) is None
    return answer, line, counted


@pytest.fixture
async def engine() -> Any:
    e = EndingEngine()
    await e.start()
    yield e
    await e.stop()


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT], ids=["completions", "chat"])
@pytest.mark.parametrize("usage", [True, False], ids=["include_usage", "no_usage"])
async def test_a_stream_broken_after_its_last_token_ends_once_counted_as_200(
    engine: EndingEngine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    path: str,
    usage: bool,
) -> None:
    engine.ending = "break_after_last"
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    with caplog.at_level(logging.ERROR):
        answer, line, counted = await served(engine, tmp_path, path, request_body(path, **extra))
    assert answer.status == 200
    assert answer.done == 1
    assert not [e for e in answer.events if "error" in e]
    assert "".join(texts(answer.events)) == "".join(text_of(i) for i in range(TOKENS))
    assert finishes(answer.events) == ["length"]
    usages = [e["usage"] for e in answer.events if e.get("usage")]
    expected = {"prompt_tokens": 3, "total_tokens": 3 + TOKENS, "completion_tokens": TOKENS}
    assert usages == ([expected] if usage else [])
    assert (line["status"], line["completion_tokens"]) == (200, TOKENS)
    assert counted == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(engine.seen) == 1  # nothing left to continue elsewhere


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT], ids=["completions", "chat"])
@pytest.mark.parametrize("usage", [True, False], ids=["include_usage", "no_usage"])
async def test_a_stream_cut_at_its_max_tokens_is_finished_for_length(
    engine: EndingEngine, tmp_path: Path, path: str, usage: bool
) -> None:
    engine.ending = "cut_at_limit"
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    if path == CHAT:
        extra["max_completion_tokens"] = TOKENS  # chat's own name for the limit wins
        extra["max_tokens"] = 100
    answer, line, counted = await served(engine, tmp_path, path, request_body(path, **extra))
    assert answer.status == 200
    assert answer.done == 1
    assert not [e for e in answer.events if "error" in e]
    assert "".join(texts(answer.events)) == "".join(text_of(i) for i in range(TOKENS))
    assert finishes(answer.events) == ["length"]
    # The finishing event is the stream's own, after its last token, and carries no text.
    final = next(e for e in answer.events if finishes([e]))
    assert (final["id"], final["model"]) == ("cmpl-end", MODEL)
    assert answer.events.index(final) == len(answer.events) - 1 - int(usage)
    assert texts([final]) == [""]
    usages = [e["usage"] for e in answer.events if e.get("usage")]
    expected = {"prompt_tokens": 3, "total_tokens": 3 + TOKENS, "completion_tokens": TOKENS}
    assert usages == ([expected] if usage else [])
    assert (line["status"], counted) == (200, 1)
    assert len(engine.seen) == 1


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT], ids=["completions", "chat"])
async def test_an_answer_assembled_from_a_stream_cut_at_its_max_tokens_is_whole(
    engine: EndingEngine, tmp_path: Path, path: str
) -> None:
    """The proxy streams a non-streamed request to be able to move it; the client still gets
    its whole answer when that stream stopped at its limit. (One broken after its last token
    is tested on the session itself: before it was fixed it spun the event loop for ever.)"""
    engine.ending = "cut_at_limit"
    body = request_body(path, stream=False)
    answer, line, counted = await served(engine, tmp_path, path, body, assemble_non_streamed=True)
    assert answer.status == 200
    (whole,) = answer.events
    choice = whole["choices"][0]
    text = choice["text"] if path == COMPLETIONS else choice["message"]["content"]
    assert text == "".join(text_of(i) for i in range(TOKENS))
    assert choice["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == TOKENS
    assert (line["status"], counted) == (200, 1)


@pytest.mark.parametrize("movable", [True, False], ids=["movable", "movable_off"])
@pytest.mark.parametrize("path", [COMPLETIONS, CHAT], ids=["completions", "chat"])
async def test_a_json_answer_to_a_streamed_request_is_relayed_as_json(
    engine: EndingEngine, tmp_path: Path, path: str, movable: bool
) -> None:
    engine.ending = "json"
    async with httpx.AsyncClient() as direct:
        straight = await direct.post(engine.url + path, json=request_body(path))
    config = fast_settings([engine.url], movable_requests=movable)
    async with running_proxy(config) as (url, app), httpx.AsyncClient(base_url=url) as c:
        r = await c.post(path, json=request_body(path))
        labels = {"endpoint": path.removeprefix("/v1/"), "model": MODEL, "status": "200"}

        def counted() -> float | None:
            return app.core.prom.get_sample_value("fleet_proxy_requests_total", labels)

        assert await eventually(counted, what="the request counted as a 200") == 1
    assert r.status_code == 200
    assert r.headers["content-type"] == straight.headers["content-type"]
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == straight.json() == whole_answer(path == CHAT)
    assert len(engine.seen) == 2  # one each: the proxy did not send it again


async def test_a_backend_that_ends_its_streams_right_is_relayed_unchanged(
    engine: EndingEngine, tmp_path: Path
) -> None:
    """The endings above are repairs: a stream that ends as vLLM ends it passes as it came."""
    body = request_body(CHAT, stream_options={"include_usage": True})
    answer, line, counted = await served(engine, tmp_path, CHAT, body)
    assert (answer.status, answer.done, counted, line["status"]) == (200, 1, 1, 200)
    assert answer.content_type.startswith("text/event-stream")
    assert finishes(answer.events) == ["length"]
    assert texts(answer.events)[-1] == text_of(TOKENS - 1)  # no event added after the last
    assert answer.events[-1]["usage"]["completion_tokens"] == TOKENS


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT], ids=["completions", "chat"])
async def test_a_simulated_engine_cut_at_max_tokens_ends_as_an_uncut_one(path: str) -> None:
    """On the simulator's vLLM-shaped streams: a stream cut right at max_tokens reaches the
    client as the uncut stream does (its text, finish_reason and usage), on the same engine."""
    limit = 12
    body: dict[str, Any] = {
        "model": SIM_MODEL, "max_tokens": limit, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    if path == COMPLETIONS:
        body["prompt"] = "The quick brown fox"
    else:
        body["messages"] = [{"role": "user", "content": "Tell me about the morning light."}]
    async with await start_fleet(1) as fleet, httpx.AsyncClient(timeout=30) as client:
        engine_url = fleet.urls[0]
        async with running_proxy(fast_settings([engine_url])) as (url, _):
            uncut = parse_stream((await client.post(url + path, json=body)).content)
            faults = {"cut_stream_after_tokens": limit}
            assert (await client.post(engine_url + "/_sim/faults", json=faults)).status_code == 200
            r = await client.post(url + path, json=body)
    cut = parse_stream(r.content)
    assert r.status_code == 200
    assert cut[1] == uncut[1] == 1  # one [DONE]
    assert not [e for e in cut[0] if "error" in e]
    assert "".join(texts(cut[0])) == "".join(texts(uncut[0]))
    assert finishes(cut[0]) == finishes(uncut[0]) == ["length"]
    usage = [e["usage"] for e in cut[0] if e.get("usage")]
    assert usage == [e["usage"] for e in uncut[0] if e.get("usage")]
    assert usage[0]["completion_tokens"] == limit
