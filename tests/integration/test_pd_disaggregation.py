"""Prefill/decode disaggregation through the proxy, on simulated engines in P and D roles."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from simulator.fleet import SimFleet, start_fleet
from tests.support.fake_backend import FakeBackend
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"


def pd_routing(decider: str = "always", threshold: int = 0) -> dict[str, Any]:
    return {
        "plugins": [
            {"type": "prefill-endpoints-filter", "name": "prefill-only"},
            {"type": "decode-endpoints-filter", "name": "decode-only"},
            {"type": "queue-depth-scorer", "name": "queue"},
            {"type": "max-score-picker", "name": "best"},
            {"type": "lmetric-picker", "name": "lmetric"},
            {
                "type": "disagg-profile-handler",
                "name": "pd",
                "params": {"decider": decider, "uncached_threshold_tokens": threshold},
            },
        ],
        "profiles": [
            {
                "name": "prefill",
                "filters": ["prefill-only"],
                "scorers": ["queue"],
                "picker": "best",
            },
            {"name": "decode", "filters": ["decode-only"], "picker": "lmetric"},
        ],
        "handler": "pd",
    }


@pytest.fixture
async def pd_fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(2, role=["prefill", "decode"], speed=20.0) as f:
        yield f


def nixl_transfers(metrics_text: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith("vllm:nixl_xfer_time_seconds_count"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _sse_tokens(
    c: httpx.AsyncClient, body: dict[str, Any]
) -> tuple[list[str], dict[str, Any] | None, httpx.Headers]:
    texts: list[str] = []
    usage = None
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            if event.get("choices"):
                texts.append(event["choices"][0]["text"])
            usage = event.get("usage") or usage
        return texts, usage, r.headers


async def test_orchestrated_mode_transfers_kv_and_matches_aggregated_output(
    pd_fleet: SimFleet,
) -> None:
    prefill, decode = pd_fleet.engines
    settings = fast_settings(
        [{"url": prefill.url, "role": "prefill"}, {"url": decode.url, "role": "decode"}],
        routing=pd_routing(),
    )
    body = {
        "model": MODEL,
        "prompt": "Disaggregate this prompt please " * 20,
        "max_tokens": 16,
        "ignore_eos": True,
        "temperature": 0,
    }
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        before = nixl_transfers((await c.get(decode.url + "/metrics")).text)
        r = await c.post("/v1/completions", json=body, headers={"x-fleet-debug": "1"})
        assert r.status_code == 200
        assert r.headers["x-fleet-backend"] == decode.url.split("//")[1]
        assert r.headers["x-fleet-prefill"] == prefill.url.split("//")[1]
        after = nixl_transfers((await c.get(decode.url + "/metrics")).text)
        assert after == before + 1
        disagg = r.json()
        assert disagg["usage"]["completion_tokens"] == 16
        assert disagg["usage"]["prompt_tokens"] > 100
        # The prefill engine released the blocks once read.
        assert prefill.engine.core.held == {}
        # Streaming through the same path gives the same tokens.
        texts, usage, _ = await _sse_tokens(
            c, {**body, "stream": True, "stream_options": {"include_usage": True}}
        )
        assert "".join(texts) == disagg["choices"][0]["text"]
        assert usage is not None and usage["completion_tokens"] == 16
        metrics = (await c.get("/metrics")).text
        assert 'fleet_proxy_pd_prefill_legs_total{outcome="ok"} 2.0' in metrics
    # An aggregated run of the same request on one engine gives the same output.
    async with httpx.AsyncClient() as c:
        plain = (await c.post(decode.url + "/v1/completions", json=body)).json()
    assert plain["choices"][0]["text"] == disagg["choices"][0]["text"]


async def test_failed_prefill_falls_back_to_local_prefill(pd_fleet: SimFleet) -> None:
    prefill, decode = pd_fleet.engines
    settings = fast_settings(
        [{"url": prefill.url, "role": "prefill"}, {"url": decode.url, "role": "decode"}],
        routing=pd_routing(),
        pd_prefill_timeout=0.5,
    )
    body = {"model": MODEL, "prompt": "fallback " * 40, "max_tokens": 8, "ignore_eos": True}
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        prefill.faults.apply({"hang": True})  # accepts, never answers: the leg times out
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200
        assert "x-fleet-prefill" not in r.headers
        assert r.json()["usage"]["completion_tokens"] == 8
        metrics = (await c.get("/metrics")).text
        assert 'fleet_proxy_pd_prefill_legs_total{outcome="timeout"} 1.0' in metrics


async def test_selective_decider_keeps_short_prompts_local(pd_fleet: SimFleet) -> None:
    prefill, decode = pd_fleet.engines
    settings = fast_settings(
        [{"url": prefill.url, "role": "prefill"}, {"url": decode.url, "role": "decode"}],
        routing=pd_routing("selective", threshold=64),
        debug_receipts=True,
    )
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        short = await c.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
            headers={"x-fleet-debug": "1"},
        )
        assert "x-fleet-prefill" not in short.headers
        assert "short_prompt" in json.loads(short.headers["x-fleet-decision"])["reason"]
        long = await c.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "long prompt words " * 100, "max_tokens": 2},
            headers={"x-fleet-debug": "1"},
        )
        assert long.headers["x-fleet-prefill"] == prefill.url.split("//")[1]
        assert "disaggregated" in json.loads(long.headers["x-fleet-decision"])["reason"]


async def test_header_mode_names_the_prefiller_to_the_decode_sidecar() -> None:
    prefill, decode = FakeBackend(), FakeBackend()
    await prefill.start()
    await decode.start()
    try:
        settings = fast_settings(
            [{"url": prefill.url, "role": "prefill"}, {"url": decode.url, "role": "decode"}],
            routing=pd_routing(),
            pd_mode="header",
        )
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
            r = await c.post(
                "/v1/completions", json={"model": "fake-model", "prompt": "x", "stream": True}
            )
            assert r.status_code == 200
        assert prefill.seen == []
        (seen,) = decode.seen
        assert seen.headers["x-prefiller-host-port"] == prefill.url.split("//")[1]
        # The client's body, plus the token ids the proxy tracks a movable stream by.
        assert seen.body == {
            "return_token_ids": True,
            "model": "fake-model",
            "prompt": "x",
            "stream": True,
        }
    finally:
        await prefill.stop()
        await decode.stop()


async def test_200_concurrent_disaggregated_streams_lose_nothing() -> None:
    async with await start_fleet(
        4, role=["prefill", "prefill", "decode", "decode"], speed=50.0
    ) as f:
        backends = [{"url": e.url, "role": e.role.value} for e in f.engines]
        settings = fast_settings(backends, routing=pd_routing())
        async with (
            running_proxy(settings) as (url, _),
            httpx.AsyncClient(
                base_url=url, timeout=120, limits=httpx.Limits(max_connections=300)
            ) as c,
        ):

            async def one(i: int) -> int:
                body = {
                    "model": MODEL,
                    "prompt": f"request {i} " + "shared context " * 30,
                    "max_tokens": 12,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                texts, usage, headers = await _sse_tokens(c, body)
                assert "x-fleet-prefill" in headers
                assert len(texts) == 12
                assert usage is not None and usage["completion_tokens"] == 12
                return len(texts)

            counts = await asyncio.gather(*(one(i) for i in range(200)))
        assert sum(counts) == 200 * 12
        for e in f.engines:
            assert e.engine.core.held == {}
