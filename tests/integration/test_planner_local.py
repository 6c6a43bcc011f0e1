"""The planner end to end under real load: a running proxy with one in-process simulated engine
whose KV cache holds a few long requests, the planning loop with a `LocalConnector`, and
clients streaming all along. A spike of concurrent long streams fills the engine's KV cache
past the scale-up threshold, so the planner adds a worker (a `fleet-proxy sim` process with
the same small cache), which then serves requests. The spike ends, the KV utilisation falls
under the scale-down threshold, and the planner removes the worker: drained, unregistered,
its process ended, while light streams go on (those on it move). Every request completes whole: [DONE],
`finish_reason` length, and usage counting exactly `max_tokens` tokens."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from fleet.types import Role
from planner.config import PlannerConfig, PlannerRole, Topology
from planner.local import SIM_COMMAND, LocalConnector, LocalSettings
from planner.loop import PlannerLoop
from planner.proxy_admin import HttpProxyAdmin
from simulator.fleet import start_fleet
from simulator.profiles import load_profile
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

pytestmark = pytest.mark.slow

MODEL = "sim-llama-8b"
# 96 blocks of 16 tokens: 1,536 tokens of KV cache per engine. A spike stream holds about
# 260 prompt + 96 generated tokens (17-23 blocks), so three of them and the light streams fill
# 60-95% of one engine; a light stream (about 15 + 64 tokens, at most 5 blocks) holds ~5%, so
# four of them over two engines stay under the scale-down threshold while keeping requests
# on both: the worker is drained with streams on it.
KV_BLOCKS = 96
SPEED = 0.5  # engine clock: a 96-token stream lasts about 1.3 s of wall time
SPIKE_STREAMS = 3
SPIKE_TOKENS = 96
LIGHT_STREAMS = 4
LIGHT_TOKENS = 64
# The spike reads 0.6-0.8 on one engine and 0.3-0.45 over two; the light streams under 0.15.
UP, DOWN = 0.5, 0.2
FILLER = "The quick brown fox jumps over the lazy dog, and then it runs away. " * 12


@dataclasses.dataclass
class Result:
    max_tokens: int
    status: int = 0
    backend: str = ""
    done: int = 0
    errors: list[Any] = dataclasses.field(default_factory=list)
    finish: str | None = None
    completion_tokens: int | None = None


async def stream_one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> Result:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = Result(max_tokens)
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        out.status, out.backend = r.status_code, r.headers.get("x-fleet-backend", "")
        buf = b""
        async for chunk in r.aiter_bytes():
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                if event[6:] == b"[DONE]":
                    out.done += 1
                    continue
                data = orjson.loads(event[6:])
                if "error" in data:
                    out.errors.append(data)
                if data.get("usage"):
                    out.completion_tokens = data["usage"]["completion_tokens"]
                for c in data.get("choices", []):
                    out.finish = c.get("finish_reason") or out.finish
    return out


async def test_real_load_scales_up_then_drains_down_without_cutting_a_request(
    tmp_path: Path,
) -> None:
    config = PlannerConfig(
        metric_pulling_interval=0.2,
        adjustment_interval=1.5,
        decode_kv_scale_up_threshold=UP,
        decode_kv_scale_down_threshold=DOWN,
        topology=Topology.AGGREGATED,
        new_decode_worker_grace_period=1,
        max_decode_replicas=2,
    )
    worker_command = [
        *SIM_COMMAND, "--num-gpu-blocks", str(KV_BLOCKS), "--speed", str(SPEED),
    ]  # fmt: skip
    local = LocalSettings(
        commands={PlannerRole.DECODE: worker_command},
        backend_roles={PlannerRole.DECODE: Role.BOTH},
        state_file=tmp_path / "state.json",
        log_dir=tmp_path / "logs",
        start_timeout_s=60.0,
        drain_deadline_s=60.0,
        stop_grace_s=10.0,
    )
    profile = load_profile("h100-llama-8b").with_overrides(num_gpu_blocks=KV_BLOCKS)
    async with await start_fleet(1, profile=profile, speed=SPEED) as fleet:
        settings = fast_settings([fleet.urls[0]], policy="round_robin")
        async with (
            running_proxy(settings) as (url, app),
            httpx.AsyncClient(timeout=60) as client,
        ):
            admin = HttpProxyAdmin(client, url)
            connector = LocalConnector(admin, local)
            loop = PlannerLoop(admin, connector, config)
            results: list[Result] = []
            sent = itertools.count()
            spike_on, light_on = asyncio.Event(), asyncio.Event()
            spike_on.set()
            light_on.set()

            async def streamer(running: asyncio.Event, long: bool) -> None:
                while running.is_set():
                    n = next(sent)  # a unique head: no two prompts share a cached block
                    prompt = f"Request {n}: " + (FILLER if long else "tell me a story.")
                    tokens = SPIKE_TOKENS if long else LIGHT_TOKENS
                    results.append(await stream_one(client, url, prompt, tokens))

            planning = asyncio.create_task(loop.run())
            streams = [
                asyncio.create_task(streamer(light_on, long=False)) for _ in range(LIGHT_STREAMS)
            ]
            streams += [
                asyncio.create_task(streamer(spike_on, long=True)) for _ in range(SPIKE_STREAMS)
            ]
            try:
                await eventually(lambda: len(connector.managed()) == 1, 40, "a worker started")
                worker = connector.managed()[0]
                await eventually(
                    lambda: app.core.fleet.get(worker.id) is not None, 30, "worker registered"
                )

                def served() -> int:
                    backend = app.core.fleet.get(worker.id)
                    return backend.load.dispatched_total if backend is not None else 0

                await eventually(lambda: served() >= 3, 30, "the new worker serves requests")
                spike_on.clear()
                await eventually(lambda: not connector.managed(), 60, "the worker removed")
                assert app.core.fleet.get(worker.id) is None
                with pytest.raises(ProcessLookupError):
                    os.kill(worker.pid, 0)
                assert [d.outcome for d in connector.last_drains] == ["drained"]
                light_on.clear()
                await asyncio.wait_for(asyncio.gather(*streams), 60)
            finally:
                spike_on.clear()
                light_on.clear()
                planning.cancel()
                for t in streams:
                    t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await planning
                await asyncio.gather(*streams, return_exceptions=True)
                await connector.stop_all()
    # Every request sent came back, whole.
    assert len(results) == next(sent)
    assert sum(r.backend == worker.id for r in results) >= 3
    for r in results:
        assert r.status == 200 and not r.errors, r
        assert r.done == 1 and r.finish == "length", r
        assert r.completion_tokens == r.max_tokens, r
    decode = [d.decision.role(PlannerRole.DECODE) for d in loop.decisions()]
    ups = [d for d in decode if d.reason == "scale_up_kv"]
    downs = [d for d in decode if d.reason == "scale_down_kv"]
    assert len(ups) == 1 and ups[0].load is not None and ups[0].load > UP, decode
    assert len(downs) == 1 and downs[0].load is not None and downs[0].load < DOWN, decode
