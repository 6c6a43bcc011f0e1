"""The Responses API under the proxy's process-wide rules, as the completions and chat path is:
its requests are in the request log, their forwarded headers count against
`max_forwarded_header_bytes` (431), and their bodies against `max_body_bytes_in_flight` (503).
Real sockets, simulated engines, the `openai` SDK."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from simulator.fleet import SimFleet, start_fleet
from tests.support.polling import eventually
from tests.support.proxy_metrics import body_bytes_in_flight as in_flight
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
KIB = 1024


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(2, speed=20.0) as f:
        yield f


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def log_lines(path: Path, n: int) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        got = [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []
        return got if len(got) >= n else None

    return await eventually(enough, what=f"{n} lines in {path}")


async def test_responses_requests_are_in_the_request_log(fleet: SimFleet, tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    settings = fast_settings(fleet.urls, request_log="json", request_log_file=path)
    async with running_proxy(settings) as (url, _):
        c = client(url)
        made = await c.responses.with_raw_response.create(
            model=MODEL, input="Hello", max_output_tokens=4, extra_headers={"x-request-id": "r-1"}
        )
        assert made.status_code == 200
        stream = await c.responses.create(
            model=MODEL, input="Tell me", max_output_tokens=4, stream=True,
            extra_headers={"x-request-id": "r-2"},
        )  # fmt: skip
        async for _ in stream:
            pass
        got = await c.responses.with_raw_response.retrieve(
            made.parse().id, extra_headers={"x-request-id": "r-3"}
        )
        assert got.status_code == 200
        await c.close()
        lines = await log_lines(path, 3)
    by_id = {line["request_id"]: line for line in lines}
    whole, streamed, read = by_id["r-1"], by_id["r-2"], by_id["r-3"]
    engines = {u.removeprefix("http://") for u in fleet.urls}
    for line in (whole, streamed):
        assert line["endpoint"] == "responses" and line["model"] == MODEL
        assert line["status"] == 200 and line["attempts"] == 1
        assert len(line["backends"]) == 1 and line["backends"][0] in engines
    assert whole["stream"] is False and whole["ttft_ms"] is None
    # A Responses answer counts its tokens as input_tokens and output_tokens.
    assert whole["completion_tokens"] == 4 and whole["prompt_tokens"] > 0
    assert streamed["stream"] is True and 0 < streamed["ttft_ms"] <= streamed["e2e_ms"]
    # Read from the store: no backend, no model.
    assert read["endpoint"] == "responses" and read["status"] == 200 and read["backends"] == []


async def test_headers_over_the_forwarding_budget_get_a_431(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        c = client(url)
        with pytest.raises(openai.APIStatusError) as refused:
            await c.responses.create(
                model=MODEL, input="Hi", max_output_tokens=2,
                extra_headers={"x-trace-context": "t" * 10 * KIB},
            )  # fmt: skip
        assert refused.value.status_code == 431
        assert "max_forwarded_header_bytes" in refused.value.message
        assert not any(s.engine.core.counters.prompt_tokens for s in fleet.engines)
        ok = await c.responses.create(
            model=MODEL, input="Hi", max_output_tokens=2,
            extra_headers={"x-trace-context": "m" * 4 * KIB},
        )  # fmt: skip
        assert ok.status in ("completed", "incomplete") and ok.output_text
        await c.close()


async def test_responses_bodies_count_against_the_body_budget(fleet: SimFleet) -> None:
    settings = fast_settings(
        fleet.urls, max_body_bytes=KIB * KIB, max_body_bytes_in_flight=KIB * KIB,
        body_bytes_wait=0.2,
    )  # fmt: skip
    # JSON whitespace: bytes the budget counts, that the parsed request leaves out.
    padding = b" " * 700 * KIB
    go_on = asyncio.Event()

    async def held_body() -> AsyncIterator[bytes]:
        yield b'{"model": "%s", "input": "Hi", "max_output_tokens": 2' % MODEL.encode() + padding
        await go_on.wait()
        yield b"}"

    async with (
        running_proxy(settings) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=60) as c,
    ):
        first = asyncio.create_task(c.post("/v1/responses", content=held_body()))

        async def holding() -> bool:
            return await in_flight(c) >= len(padding)

        await eventually(holding, 30, "the first body's bytes in the budget")
        second = b'{"model": "%s", "input": "Hi", "max_output_tokens": 2}' % MODEL.encode()
        late = await c.post("/v1/responses", content=second + padding)
        assert late.status_code == 503, late.text
        assert "max_body_bytes_in_flight" in late.json()["error"]["message"]
        go_on.set()
        done = await first
        assert done.status_code == 200, done.text

        async def drained() -> bool:
            return await in_flight(c) == 0

        await eventually(drained, 30, "the body budget back to 0")
        again = await c.post("/v1/responses", content=second + padding)
        assert again.status_code == 200, again.text


async def test_a_background_response_is_logged_when_its_run_ends(
    fleet: SimFleet, tmp_path: Path
) -> None:
    path = tmp_path / "requests.jsonl"
    settings = fast_settings(fleet.urls, request_log="json", request_log_file=path)
    async with (
        running_proxy(settings) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        sdk = client(url)
        queued = await sdk.responses.create(
            model=MODEL, input="Later", max_output_tokens=4, background=True,
            extra_headers={"x-request-id": "bg-1"},
        )  # fmt: skip
        assert queued.status == "queued"
        (line,) = await log_lines(path, 1)
        assert line["request_id"] == "bg-1" and line["status"] == 200
        assert line["model"] == MODEL and len(line["backends"]) == 1
        assert line["completion_tokens"] == 4
        stored = await sdk.responses.retrieve(queued.id)
        assert stored.status in ("completed", "incomplete")

        async def drained() -> bool:
            return await in_flight(c) == 0

        await eventually(drained, 30, "the body budget back to 0")
        await sdk.close()
