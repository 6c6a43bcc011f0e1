"""The planner end to end: a running proxy with one in-process simulated engine, the planning
loop with a `LocalConnector`, and a client streaming all along. A scripted KV reading makes
the planner add a worker (a `fleet-proxy sim` process), then remove it: drained, its streams
moved, unregistered, its process ended. No request fails or is cut."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from fleet.types import Role
from planner.admin import BackendStatus, HttpProxyAdmin, LiveRequest
from planner.config import PlannerConfig, PlannerRole, Topology
from planner.local import LocalConnector, LocalSettings
from planner.loop import PlannerLoop
from simulator.fleet import start_fleet
from tests.support.servers import fast_settings, running_proxy

pytestmark = pytest.mark.slow

MODEL = "sim-llama-8b"


@dataclasses.dataclass
class ScriptedKv:
    """The proxy's admin API with the KV utilisation the test says, so the decisions are the
    script's while everything else (workers, drains, requests) is real."""

    inner: HttpProxyAdmin
    kv: float

    async def backends(self) -> list[BackendStatus]:
        return [dataclasses.replace(b, kv_usage=self.kv) for b in await self.inner.backends()]

    async def live_requests(self) -> list[LiveRequest]:
        return await self.inner.live_requests()

    async def add_backend(self, backend_id: str, url: str, role: Role) -> None:
        await self.inner.add_backend(backend_id, url, role)

    async def drain(self, backend_id: str) -> None:
        await self.inner.drain(backend_id)

    async def undrain(self, backend_id: str) -> None:
        await self.inner.undrain(backend_id)

    async def evacuate(self, backend_id: str) -> dict[str, int]:
        return await self.inner.evacuate(backend_id)

    async def remove_backend(self, backend_id: str) -> None:
        await self.inner.remove_backend(backend_id)


@dataclasses.dataclass
class Result:
    status: int
    backend: str
    done: int = 0
    errors: list[Any] = dataclasses.field(default_factory=list)
    finish: str | None = None
    chunks: int = 0


async def stream_one(client: httpx.AsyncClient, url: str, max_tokens: int) -> Result:
    body = {
        "model": MODEL,
        "prompt": "The quick brown fox jumps over the lazy dog, and then",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        out = Result(r.status_code, r.headers.get("x-fleet-backend", ""))
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
                for c in data.get("choices", []):
                    out.chunks += 1
                    out.finish = c.get("finish_reason") or out.finish
        return out


async def eventually(check: Callable[[], bool], within: float, what: str) -> None:
    for _ in range(int(within / 0.1)):
        if check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {within}s: {what}")


async def test_scale_up_then_drain_down_without_cutting_a_request(tmp_path: Path) -> None:
    config = PlannerConfig(
        metric_pulling_interval=0.25,
        adjustment_interval=2.0,
        topology=Topology.AGGREGATED,
        new_decode_worker_grace_period=0,
        max_decode_replicas=2,
    )
    local = LocalSettings(
        backend_roles={PlannerRole.DECODE: Role.BOTH},
        state_file=tmp_path / "state.json",
        log_dir=tmp_path / "logs",
        start_timeout_s=60.0,
        drain_deadline_s=60.0,
        stop_grace_s=10.0,
    )
    async with await start_fleet(1, speed=1.0) as fleet:
        settings = fast_settings([fleet.urls[0]], policy="round_robin")
        async with (
            running_proxy(settings) as (url, app),
            httpx.AsyncClient(timeout=60) as client,
        ):
            admin = ScriptedKv(HttpProxyAdmin(client, url), kv=0.95)
            connector = LocalConnector(admin, local)
            loop = PlannerLoop(admin, connector, config)
            results: list[Result] = []
            stop = asyncio.Event()

            async def streamer() -> None:
                while not stop.is_set():
                    results.append(await stream_one(client, url, 120))

            planning = asyncio.create_task(loop.run())
            streams = [asyncio.create_task(streamer()) for _ in range(4)]
            try:
                await eventually(lambda: len(connector.managed()) == 1, 30, "a worker started")
                worker = connector.managed()[0]
                await eventually(
                    lambda: app.core.fleet.get(worker.id) is not None, 30, "worker registered"
                )
                # Streams reach the new worker before it is drained.
                await eventually(
                    lambda: len(app.core.live.on_backend(worker.id)) > 0, 30, "streams on it"
                )
                admin.kv = 0.1
                await eventually(lambda: not connector.managed(), 60, "the worker removed")
                assert app.core.fleet.get(worker.id) is None
                with pytest.raises(ProcessLookupError):
                    os.kill(worker.pid, 0)
                drains = connector.last_drains
                assert [d.outcome for d in drains] == ["drained"]
                stop.set()
                await asyncio.wait_for(asyncio.gather(*streams), 60)
            finally:
                stop.set()
                planning.cancel()
                for t in streams:
                    t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await planning
                await asyncio.gather(*streams, return_exceptions=True)
                await connector.stop_all()
            assert any(r.backend == worker.id for r in results)
            for r in results:
                assert r.status == 200 and not r.errors, r
                assert r.done == 1 and r.finish == "length", r
            reasons = [d.decision.role(PlannerRole.DECODE).reason for d in loop.decisions()]
            assert "scale_up_kv" in reasons and "scale_down_kv" in reasons
