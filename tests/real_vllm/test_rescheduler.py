"""The rescheduler on two real engines: one engine runs both streams, the other none; the
`neutral_load` policy moves one of them to the idle engine, and both clients still get the
greedy output of an uninterrupted run.

These CPU engines may generate a whole stream while holding its output back for seconds, then
send it in one burst: the busy engine is frozen (SIGSTOP) for the moment the rescheduler needs,
so the streams are still running when it acts."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.real_vllm.moves import Read, body, read_stream
from tests.real_vllm.tier import Proxy, Tier, start_proxy
from tests.support.polling import eventually, holds_within

pytestmark = pytest.mark.real_vllm

ENDPOINT = "/v1/completions"
TOKENS = 3000  # long enough to still run when the rescheduler acts (the model is tiny)
# The 2-core machine's engines sometimes hold their output back for seconds and then send it
# in one burst: both streams can end before the rescheduler's next cycle. Such a try is made
# again.
TRIES = 3


def rescheduling_config(tier: Tier, path: Path) -> Path:
    """The engine running 2 requests is over the threshold (1.5 requests), the idle one
    under it; one request moves (NUM_REQ 1), after which 1 and 1 differ by less than the
    least difference that moves (1.0): no move back."""
    config: dict[str, Any] = {
        "backends": [{"url": e.url} for e in tier.engines],
        "policy": "round_robin",
        "enable_rescheduling": True,
        "rescheduling_policies": ["neutral_load"],
        "rescheduling_interval_ms": 200,
        "rescheduling_neutral_load_metric": "num_requests",
        "rescheduling_neutral_load_threshold": 1.5,
        "rescheduling_load_balance_threshold": 1.0,
        "rescheduling_req_select_rule": "NUM_REQ",
        "rescheduling_req_select_value": 1,
        # Moves of a few thousand tokens on a loaded 2-core machine can take seconds.
        "rescheduling_migration_timeout": 60,
        # The busy engine is frozen for a few seconds (see below): not a dead engine.
        "unhealthy_after": 30,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def moved_ok(metrics: str) -> float:
    found = re.search(
        r'^fleet_proxy_migrations_total\{outcome="ok",reason="neutral_load"\} (\S+)$',
        metrics,
        re.MULTILINE,
    )
    return float(found.group(1)) if found else 0.0


async def both_running_on(
    client: httpx.AsyncClient, proxy: Proxy, backend: str, streams: list[asyncio.Task[Read]]
) -> bool:
    """Both streams have relayed a few tokens from `backend`; False if one ended first."""

    async def outcome() -> str | None:
        if any(s.done() for s in streams):
            return "ended"
        rows = (await client.get(proxy.url + "/admin/requests")).json()
        both = len(rows) == 2 and all(
            r["backend"] == backend and (r["tokens_generated"] or 0) >= 8 for r in rows
        )
        return "running" if both else None

    got = await eventually(outcome, within=120, what="both streams relaying", every=0.02)
    return got == "running"


async def scraped_running(client: httpx.AsyncClient, proxy: Proxy, backend: str) -> float:
    """The engine's own running count, as the proxy last scraped it."""
    for b in (await client.get(proxy.url + "/admin/backends")).json():
        if b["id"] == backend and b["metrics"] is not None:
            return float(b["metrics"]["running"])
    return 0.0


async def test_the_rescheduler_moves_a_running_request_off_the_busier_engine(
    tier: Tier, tmp_path: Path
) -> None:
    config = rescheduling_config(tier, tmp_path / "proxy.yaml")
    proxy = start_proxy(tier, "round_robin", tmp_path, config=config)
    busy, idle = tier.engines[0], tier.engines[1]
    request = body(tier.model, ENDPOINT, TOKENS)
    try:
        async with httpx.AsyncClient(timeout=300) as client:
            reference = await read_stream(client, busy.url + ENDPOINT, request)
            assert len(reference.token_ids) == TOKENS and reference.done == 1
            assert len(set(reference.token_ids)) > 20, reference.token_ids
            for _ in range(TRIES):
                before = moved_ok((await client.get(f"{proxy.url}/metrics")).text)
                # Both requests land on the busy engine while the other takes none.
                await client.post(f"{proxy.url}/admin/backends/{idle.backend_id}/drain")
                streams = [
                    asyncio.create_task(read_stream(client, proxy.url + ENDPOINT, request))
                    for _ in range(2)
                ]
                ready = await asyncio.wait_for(
                    both_running_on(client, proxy, busy.backend_id, streams), timeout=120
                )

                async def seen_running() -> bool:
                    return await scraped_running(client, proxy, busy.backend_id) >= 2

                async def moved(before: float = before) -> bool:
                    text = (await client.get(f"{proxy.url}/metrics")).text
                    return moved_ok(text) > before

                # Once the proxy's scrape shows the busy engine running both, it is frozen
                # (SIGSTOP), so that a burst cannot finish them before the rescheduler's next
                # cycle; it thaws once the move is done, or after 10 s.
                frozen = ready and await holds_within(seen_running, within=10, every=0.05)
                if frozen:
                    os.killpg(busy.pid, signal.SIGSTOP)
                try:
                    await client.post(f"{proxy.url}/admin/backends/{idle.backend_id}/undrain")
                    if frozen:
                        await holds_within(moved, within=10, every=0.05)
                finally:
                    if frozen:
                        os.killpg(busy.pid, signal.SIGCONT)
                results: list[Read] = await asyncio.gather(*streams)
                metrics = (await client.get(f"{proxy.url}/metrics")).text
                cycles = (await client.get(f"{proxy.url}/admin/rescheduler")).json()
                if ready and moved_ok(metrics) > before:
                    break
            else:
                pytest.fail(f"in {TRIES} tries both streams ended before the rescheduler acted")
        for got in results:
            assert got.errors == [] and got.done == 1, got.events[-3:]
            assert got.token_ids == reference.token_ids
            assert got.text == reference.text
        # It moved exactly one: the other stayed, and nothing moved back.
        assert moved_ok(metrics) - before == 1, metrics
        pairs = [
            (m["source"], m["target"])
            for cycle in cycles["migrating_cycles"]
            for m in cycle["pairs"]
            if m["policy"] == "neutral_load"
        ]
        assert (busy.backend_id, idle.backend_id) in pairs, cycles
        assert (idle.backend_id, busy.backend_id) not in pairs, cycles
    finally:
        proxy.stop()
