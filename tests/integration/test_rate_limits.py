"""Per-tenant rate limits through real sockets, read with the OpenAI SDK as a client would:
the quota headers on every answer, OpenAI's 429 past a limit, tokens charged from the
answers' usage, and one limit for the whole proxy with `--workers 2`.

The limits are per minute and refill continuously; each test stays well inside the time one
request (or the tokens asked) takes to come back, so the counts are exact."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from simulator.fleet import DEFAULT_MODEL, SimFleet, start_fleet
from tests.integration.test_workers import Served, serve
from tests.support.fake_backend import FakeBackend
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

pytestmark = pytest.mark.slow


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(1, speed=50.0) as f:
        yield f


@contextlib.asynccontextmanager
async def limited(fleet: SimFleet, rate_limits: dict[str, Any]) -> AsyncIterator[str]:
    settings = fast_settings(fleet.urls, flow_control={"rate_limits": rate_limits})
    async with running_proxy(settings) as (url, _):
        yield url


async def test_requests_per_minute_headers_then_openai_429(fleet: SimFleet) -> None:
    limits = {"tenants": {"team-a": {"requests_per_minute": 2}}}
    async with (
        limited(fleet, limits) as url,
        openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client,
    ):
        team_a = {"x-gateway-fairness-id": "team-a"}
        for left, stream in (("1", False), ("0", True)):  # a whole answer, then a stream
            raw = await client.completions.with_raw_response.create(
                model=DEFAULT_MODEL,
                prompt="hello",
                max_tokens=2,
                stream=stream,
                extra_headers=team_a,
            )
            answer = raw.parse()
            if stream:
                assert [chunk async for chunk in answer]
            else:
                assert answer.choices[0].text
            assert raw.headers["x-ratelimit-limit-requests"] == "2"
            assert raw.headers["x-ratelimit-remaining-requests"] == left
            assert re.fullmatch(r"\d+(\.\d+)?s", raw.headers["x-ratelimit-reset-requests"])
            assert "x-ratelimit-limit-tokens" not in raw.headers
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(
                model=DEFAULT_MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                extra_headers=team_a,
            )
        e = refused.value
        assert e.code == "rate_limit_exceeded" and e.type == "requests"
        assert "Rate limit reached" in e.message
        assert int(e.response.headers["retry-after"]) >= 1
        assert e.response.headers["x-ratelimit-remaining-requests"] == "0"
        # Another tenant has no limit: no quota headers, no refusal.
        raw = await client.completions.with_raw_response.create(
            model=DEFAULT_MODEL, prompt="hello", max_tokens=2
        )
        assert "x-ratelimit-limit-requests" not in raw.headers
        async with httpx.AsyncClient() as plain:
            metrics = (await plain.get(url + "/metrics")).text
        assert 'fleet_proxy_rate_limited_requests_total{limit="requests",tenant="team-a"} 1.0' in (
            metrics
        )
        dispatched = 'outcome="Dispatched",priority="0",tenant="team-a"'
        assert f"fleet_proxy_flow_control_requests_total{{{dispatched}}} 2.0" in metrics
        # A tenant no setting names is counted as "other": clients cannot grow the series.
        assert 'outcome="Dispatched",priority="0",tenant="other"} 1.0' in metrics


async def test_tokens_are_charged_as_the_usage_says(fleet: SimFleet) -> None:
    # The prompt estimate is a few tokens; each answer's usage is 150 more. Without the
    # correction the third request would pass.
    limits = {"default": {"tokens_per_minute": 250}}
    async with (
        limited(fleet, limits) as url,
        openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client,
    ):

        async def long_answer() -> Any:
            return await client.completions.with_raw_response.create(
                model=DEFAULT_MODEL,
                prompt="count",
                max_tokens=150,
                extra_body={"ignore_eos": True},
            )

        first = await long_answer()
        assert first.headers["x-ratelimit-limit-tokens"] == "250"
        assert int(first.headers["x-ratelimit-remaining-tokens"]) > 240  # the estimate only
        assert first.parse().usage.completion_tokens == 150
        second = await long_answer()
        assert int(second.headers["x-ratelimit-remaining-tokens"]) < 250 - 140
        with pytest.raises(openai.RateLimitError) as refused:
            await long_answer()
        assert refused.value.type == "tokens"
        assert refused.value.code == "rate_limit_exceeded"


async def _worker_refusals(url: str) -> dict[str, float]:
    """Each worker's count of rate-limited requests, asked on new connections until both
    have answered."""
    seen: dict[str, float] = {}

    async def both() -> bool:
        async with httpx.AsyncClient(timeout=5) as fresh:
            text = (await fresh.get(url + "/metrics")).text
        worker = re.search(r'target_info\{[^}]*worker="(\d)"', text)
        assert worker is not None
        total = sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("fleet_proxy_rate_limited_requests_total{")
        )
        seen[worker.group(1)] = total
        return len(seen) == 2

    await eventually(both, within=20, what="both workers' metrics", every=0.02)
    return seen


@contextlib.asynccontextmanager
async def two_workers(
    flow: dict[str, Any], backend: FakeBackend
) -> AsyncIterator[tuple[Served, httpx.AsyncClient]]:
    """`serve --workers 2` with `flow` in front of `backend`, and a client opening a new
    connection per request: each is accepted by whichever worker takes it."""
    await backend.start()
    env = {"FLEET_PROXY_FLOW_CONTROL": json.dumps(flow)}
    limits = httpx.Limits(max_keepalive_connections=0)
    try:
        async with (
            serve([backend.url], env_extra=env) as served,
            httpx.AsyncClient(timeout=30, limits=limits) as client,
        ):
            yield served, client
    finally:
        await backend.stop()


COMPLETION = {"model": "fake-model", "prompt": "hi", "max_tokens": 4}


async def test_two_workers_share_one_limit() -> None:
    backend = FakeBackend()
    flow = {"rate_limits": {"default": {"requests_per_minute": 2}}}
    async with two_workers(flow, backend) as (served, client):
        url = served.url + "/v1/completions"
        first = [await client.post(url, json=COMPLETION) for _ in range(2)]
        assert [r.status_code for r in first] == [200, 200]
        assert [r.headers["x-ratelimit-remaining-requests"] for r in first] == ["1", "0"]
        # Until both workers have refused one: every request after the two is a 429,
        # whichever worker took it.
        statuses: list[int] = []

        async def both_refused() -> bool:
            for _ in range(4):
                statuses.append((await client.post(url, json=COMPLETION)).status_code)
            return min((await _worker_refusals(served.url)).values()) > 0

        await eventually(both_refused, within=20, what="both workers refusing")
        assert statuses and set(statuses) == {429}
        rows = (await served.workers(client))["rows"]
        assert sum(row["dispatched"] for row in rows) == 2


async def test_two_workers_show_every_workers_queue() -> None:
    """Each worker queues its own requests; /admin/flow and /metrics from either worker
    count them all."""
    backend = FakeBackend()
    hold = backend.behaviour.hold = asyncio.Semaphore(0)  # nothing finishes until released
    sent = 8
    async with two_workers({"saturation": {"queue_depth_threshold": 1}}, backend) as (
        served,
        client,
    ):
        url = served.url + "/v1/completions"
        requests = [asyncio.ensure_future(client.post(url, json=COMPLETION)) for _ in range(sent)]
        views: dict[int, dict[str, Any]] = {}

        async def both_count_all() -> bool:
            view = (await client.get(served.url + "/admin/flow")).json()
            metrics = (await client.get(served.url + "/metrics")).text
            waiting = view["waiting_all_workers"]
            per_worker = {w["worker"]: w["waiting"] for w in view["workers"]}
            shown = sum(
                float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith("fleet_proxy_flow_control_waiting_workers{")
            )
            if waiting + backend.active == sent and shown == waiting > 0:
                assert sum(per_worker.values()) == waiting
                views[view["answered_by"]] = per_worker
            return len(views) == 2

        await eventually(both_count_all, within=30, what="both workers count every queue")
        for _ in range(sent):
            hold.release()
        answers = await asyncio.gather(*requests)
        assert [r.status_code for r in answers] == [200] * sent
