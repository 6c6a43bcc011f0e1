"""The latency scorer and SLO tier filter through the proxy, in front of two simulated engines
on real ports, one of them eight times slower: the predictions come from the engines' own
latency histograms, and the request's x-slo-ttft-ms decides where it goes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from simulator.fleet import start_fleet
from simulator.tokenizer import Tokenizer
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
ROUTING = {
    "plugins": [
        {"type": "slo-headroom-tier-filter", "name": "tier"},
        {"type": "latency-scorer", "name": "lat", "params": {"headroom": "least"}},
        {"type": "max-score-picker", "name": "best", "params": {"seed": 7}},
    ],
    "profiles": [{"name": "default", "filters": ["tier"], "scorers": ["lat"], "picker": "best"}],
}
PROMPT = "Summarise the routing decision in one line. " * 20


async def warm(url: str, n: int) -> None:
    """Finished requests on the engine itself, so its histograms have observations."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        for i in range(n):
            r = await c.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": f"{i} {PROMPT}", "max_tokens": 8},
            )
            assert r.status_code == 200, r.text


async def observed(client: httpx.AsyncClient, ids: list[str], requests: int) -> None:
    """Until the proxy's last scrape of each engine has `requests` finished prefills."""

    async def scraped() -> bool:
        views = {b["id"]: b for b in (await client.get("/admin/backends")).json()}
        return all(
            (views[i]["metrics"] or {}).get("prefill_time_count", 0) >= requests for i in ids
        )

    await eventually(scraped, within=30, what="the proxy's scrape of the warm-up", every=0.02)


async def test_the_slo_header_routes_by_predicted_latency() -> None:
    async with await start_fleet(2, speed=10.0, tokenizer=Tokenizer()) as fleet:
        fleet.engines[1].engine.faults.apply({"slowdown": 8.0})
        fast, slow = (u.removeprefix("http://") for u in fleet.urls)
        await asyncio.gather(warm(fleet.urls[0], 3), warm(fleet.urls[1], 3))
        settings = fast_settings(fleet.urls, routing=ROUTING, debug_receipts=True)
        async with (
            running_proxy(settings) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=60) as client,
        ):
            await observed(client, [fast, slow], 3)

            async def ask(**headers: str) -> tuple[str, dict[str, Any]]:
                r = await client.post(
                    "/v1/completions",
                    json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2},
                    headers={"x-fleet-debug": "1", **headers},
                )
                assert r.status_code == 200, r.text
                receipt = json.loads(r.headers["x-fleet-decision"])
                return r.headers["x-fleet-backend"], receipt["scores"]

            # No SLO: every engine is kept and the lower prediction wins.
            backend, scores = await ask()
            assert backend == fast and set(scores) == {fast, slow}
            f_ms, s_ms = scores[fast]["lat.ttft_ms"], scores[slow]["lat.ttft_ms"]
            assert s_ms > 4 * f_ms  # eight times slower steps, seen in its histograms

            # A TTFT objective only the fast engine meets: the slow one is filtered out.
            between = f"{(f_ms * s_ms) ** 0.5:.1f}"
            for _ in range(3):
                backend, scores = await ask(**{"x-slo-ttft-ms": between})
                assert backend == fast and set(scores) == {fast}

            # An objective both meet, with `least` headroom: the tightest fit that still meets
            # it, the slow engine, keeping the fast one free.
            loose = f"{3 * s_ms:.1f}"
            backend, scores = await ask(**{"x-slo-ttft-ms": loose})
            assert backend == slow and set(scores) == {fast, slow}
            assert scores[slow]["lat"] > scores[fast]["lat"]
