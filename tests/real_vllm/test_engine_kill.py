"""SIGKILL one of the two real engines while it streams: every client still gets the greedy
output of an uninterrupted run. The tier runs this last, in a phase of its own: it leaves one
engine alive."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.real_vllm.moves import TOTAL, body, read_stream
from tests.real_vllm.tier import Engine, Tier, start_proxy
from tests.support.polling import eventually

pytestmark = pytest.mark.real_vllm

ENDPOINTS = ["/v1/completions", "/v1/chat/completions"]
TOKENS = 3000  # long enough that the killed engine is surely mid-stream (the model is tiny)


async def busy_backend(client: httpx.AsyncClient, url: str) -> str:
    """The backend of a live request with a few tokens relayed and most still to come (the
    proxy's view): these engines sometimes send a whole stream in one burst at its end."""

    async def found() -> str | None:
        rows = (await client.get(url + "/admin/requests")).json()
        for row in rows:
            if 8 <= (row["tokens_generated"] or 0) <= TOKENS // 2:
                return str(row["backend"])
        return None

    return await eventually(found, within=120, what="a stream part-way", every=0.02)


async def freeze_a_busy_engine(client: httpx.AsyncClient, url: str, tier: Tier) -> Engine:
    """An engine frozen (SIGSTOP) while the proxy still relays an unfinished stream from it.

    The proxy's view can lag on a loaded machine (its admin answer once took 6 s), so a
    stream seen mid-way may have ended by the time its engine is killed. Frozen, the engine
    can send nothing more: once what it had sent is read, a stream still unfinished in the
    proxy's view stays unfinished until the kill."""
    while True:
        engine = tier.by_backend_id(await busy_backend(client, url))
        os.killpg(engine.pid, signal.SIGSTOP)
        await asyncio.sleep(1.0)  # the proxy reads what the engine had already sent
        rows = (await client.get(url + "/admin/requests")).json()
        if any(
            r["backend"] == engine.backend_id and (r["tokens_generated"] or 0) < TOKENS
            for r in rows
        ):
            return engine
        os.killpg(engine.pid, signal.SIGCONT)  # its streams ended first: try again


async def test_killing_an_engine_mid_stream_loses_nothing(tier: Tier, tmp_path: Path) -> None:
    proxy = start_proxy(tier, "round_robin", tmp_path)
    try:
        async with httpx.AsyncClient(timeout=300) as client:
            refs = {
                ep: await read_stream(
                    client, tier.engines[0].url + ep, body(tier.model, ep, TOKENS)
                )
                for ep in ENDPOINTS
            }
            for ref in refs.values():
                assert len(ref.token_ids) == TOKENS and len(set(ref.token_ids)) > TOTAL // 2
            # Four streams, round-robin: each engine serves one of each kind. As soon as the
            # proxy has relayed a few tokens of one, that one's engine is killed.
            streams = [
                asyncio.create_task(
                    read_stream(client, proxy.url + ep, body(tier.model, ep, TOKENS))
                )
                for ep in ENDPOINTS
                for _ in range(2)
            ]
            victim = await asyncio.wait_for(
                freeze_a_busy_engine(client, proxy.url, tier), timeout=120
            )
            os.killpg(victim.pid, signal.SIGKILL)
            results = await asyncio.gather(*streams)
            metrics = (await client.get(f"{proxy.url}/metrics")).text
        for i, got in enumerate(results):
            ref = refs[ENDPOINTS[i // 2]]
            assert got.errors == [] and got.done == 1, got.events[-3:]
            assert got.token_ids == ref.token_ids
            assert got.text == ref.text
        # The victim still held an unfinished stream when it was killed: it moved.
        moved = re.search(
            r'^fleet_proxy_migrations_total\{outcome="ok",reason="backend_failed"\} (\S+)$',
            metrics,
            re.MULTILINE,
        )
        assert moved is not None and float(moved.group(1)) >= 1, metrics[-2000:]
    finally:
        proxy.stop()
