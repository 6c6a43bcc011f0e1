"""Structured request logs from real requests through a real proxy."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.request.entry import Forwarder
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy


def read(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


async def lines(path: Path, n: int) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        got = read(path)
        return got if len(got) >= n else None

    return await eventually(enough, what=f"{n} lines in {path}")


async def test_one_json_line_per_request_with_its_fields(backend, tmp_path):
    path = tmp_path / "requests.jsonl"
    settings = fast_settings([backend.url], request_log="json", request_log_file=path)
    backend_id = backend.url.removeprefix("http://")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        whole = await c.post(
            "/v1/completions",
            json={"model": "fake-model", "prompt": "hello", "max_tokens": 8},
            headers={"x-request-id": "log-whole"},
        )
        assert whole.status_code == 200
        streamed = await c.post(
            "/v1/chat/completions",
            json={
                "model": "fake-model",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
            },
            headers={"x-request-id": "log-stream"},
        )
        assert streamed.status_code == 200
        bad = await c.post("/v1/completions", json={"prompt": "no model"})
        assert bad.status_code == 400
        got = await lines(path, 3)
    by_id = {line["request_id"]: line for line in got}

    one = by_id["log-whole"]
    assert one["endpoint"] == "completions"
    assert one["model"] == "fake-model"
    assert one["stream"] is False
    assert one["status"] == 200
    assert one["backends"] == [backend_id]
    assert (one["attempts"], one["retries"], one["moves"]) == (1, 0, 0)
    assert one["prompt_tokens"] == 3  # the backend's usage
    assert one["completion_tokens"] == 8
    assert one["routed_prompt_tokens"] == 2  # "hello": 5 characters at 4 a token, rounded up
    assert one["ttft_ms"] is None
    assert one["e2e_ms"] > 0
    assert one["client_disconnect"] is False
    arrived = datetime.datetime.fromisoformat(one["time"].replace("Z", "+00:00"))
    now = datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(0) <= now - arrived < datetime.timedelta(minutes=5)

    two = by_id["log-stream"]
    assert two["endpoint"] == "chat/completions"
    assert two["stream"] is True
    assert two["status"] == 200
    assert two["backends"] == [backend_id]
    assert two["ttft_ms"] is not None
    assert 0 < two["ttft_ms"] <= two["e2e_ms"]

    (three,) = [line for line in got if line["status"] == 400]
    assert three["model"] is None
    assert three["backends"] == []
    assert len(three["request_id"]) == 32  # the id the proxy made up, as in x-request-id


async def test_a_zero_sample_rate_writes_nothing(backend, tmp_path):
    path = tmp_path / "requests.jsonl"
    settings = fast_settings(
        [backend.url], request_log="json", request_log_file=path, request_log_sample_rate=0.0
    )
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        for _ in range(5):
            r = await c.post(
                "/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 2}
            )
            assert r.status_code == 200
    # The proxy has stopped: anything queued would have been written on the way out.
    assert path.read_bytes() == b""


async def test_lines_queued_at_shutdown_are_written(backend, tmp_path):
    path = tmp_path / "requests.jsonl"
    settings = fast_settings([backend.url], request_log="json", request_log_file=path)
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        assert app.core.request_log is not None
        r = await c.post(
            "/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 2}
        )
        assert r.status_code == 200
    assert len(path.read_bytes().splitlines()) == 1


async def test_off_by_default_nothing_is_built(backend):
    async with running_proxy(fast_settings([backend.url])) as (_, app):
        assert app.core.request_log is None
        assert isinstance(app.forwarder, Forwarder)
        assert app.forwarder._request_log is None
