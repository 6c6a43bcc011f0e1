"""Simulated engines publish vLLM's KV-cache events on real ZMQ sockets: what a request
caches arrives on a SUB socket in vLLM's wire format, a replay returns what was missed, and a
restarted engine numbers its batches from 0 again."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
import zmq.asyncio

from fleet.kv_events import AllBlocksCleared, BatchCodec, BlockStored
from proxy.backends.kv_event_subscribers import fetch_replay
from simulator.fleet import SimFleet, start_fleet
from simulator.kv_events_config import parse_kv_events_config
from simulator.server import EngineServer
from simulator.tokenizer import Tokenizer
from tests.support.kv_events import SIM_KV_EVENTS, fresh_prompts, subscribed

MODEL = "sim-llama-8b"


@pytest.fixture
async def kv_fleet(tokenizer: Tokenizer) -> AsyncIterator[SimFleet]:
    async with await start_fleet(
        2, speed=20.0, tokenizer=tokenizer, kv_events=parse_kv_events_config(SIM_KV_EVENTS)
    ) as f:
        yield f


def publisher(server: EngineServer) -> tuple[str, str]:
    pub = server.kv_publisher
    assert pub is not None and pub.replay_endpoint is not None
    return pub.endpoint, pub.replay_endpoint


async def complete(client: httpx.AsyncClient, server: EngineServer, prompt: str) -> None:
    r = await client.post(
        server.url + "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 1},
    )
    assert r.status_code == 200, r.text


async def test_a_requests_cached_blocks_arrive_on_a_sub_socket(kv_fleet: SimFleet) -> None:
    engine = kv_fleet.engines[0]
    endpoint, replay = publisher(engine)
    # Bound on the engines' host, each engine on ports of its own.
    assert endpoint.startswith("tcp://127.0.0.1:")
    assert len({*publisher(kv_fleet.engines[0]), *publisher(kv_fleet.engines[1])}) == 4
    async with httpx.AsyncClient(timeout=10) as client, subscribed(endpoint, b"kv") as sub:
        prompts = fresh_prompts("cache me")
        last = ""

        async def send() -> None:
            nonlocal last
            last = next(prompts)
            await complete(client, engine, last)

        topic, seq, batch = await sub.after(send)
        assert topic == b"kv"
        stored = [e for e in batch.events if isinstance(e, BlockStored)]
        assert stored and stored[0].parent_block_hash is None
        tokens = (
            await client.post(engine.url + "/tokenize", json={"model": MODEL, "prompt": last})
        ).json()["tokens"]
        size = stored[0].block_size
        assert stored[0].token_ids == tokens[: len(stored[0].block_hashes) * size]
        # The replay socket has every batch from 0 up to this one, then the end marker.
        context = zmq.asyncio.Context()
        try:
            batches, bad, reached_end = await fetch_replay(context, replay, 0, 5.0, BatchCodec())
        finally:
            context.destroy(linger=0)
        assert bad == 0 and reached_end
        assert [s for s, _ in batches] == list(range(seq + 1))
        assert batches[seq][1] == batch


async def test_a_reset_clears_and_a_restart_numbers_from_zero(kv_fleet: SimFleet) -> None:
    engine = kv_fleet.engines[1]
    endpoint, _ = publisher(engine)
    prompts = fresh_prompts("warm")
    async with httpx.AsyncClient(timeout=10) as client, subscribed(endpoint) as sub:
        _, first, _ = await sub.after(lambda: complete(client, engine, next(prompts)))
        r = await client.post(engine.url + "/reset_prefix_cache")
        assert r.status_code == 200
        # Later batches of the warm-up may come first; the clear follows in order.
        seq, batch = first, None
        while batch is None or batch.events != [AllBlocksCleared()]:
            _, s, batch = await sub.next(5.0)
            assert s == seq + 1
            seq = s
        await engine.crash()
        await engine.recover()
        _, after, _ = await sub.after(lambda: complete(client, engine, next(prompts)))
        assert after == 0


async def test_the_cli_flag_publishes() -> None:
    config = SIM_KV_EVENTS.replace('"tcp://*:0", "topic"', 'null, "topic"')
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.serving.cli", "sim", "--engines", "1", "--base-port", "0",
        "--speed", "20", "--kv-events-config", config,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        url = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().strip()
        line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
        assert line.startswith(f"{url} publishes KV events on tcp://127.0.0.1:"), line
        assert "replays" not in line  # none configured
        endpoint = line.split(" on ")[1].strip()
        prompts = fresh_prompts("cli")
        async with httpx.AsyncClient(timeout=10) as client, subscribed(endpoint) as sub:

            async def send() -> None:
                r = await client.post(
                    url + "/v1/completions",
                    json={"model": MODEL, "prompt": next(prompts), "max_tokens": 1},
                )
                assert r.status_code == 200

            _, _, batch = await sub.after(send)
            assert any(isinstance(e, BlockStored) for e in batch.events)
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 10)
