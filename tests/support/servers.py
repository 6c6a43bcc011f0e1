"""Run the real proxy under uvicorn on an ephemeral port inside the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn

from proxy.control.peer_sync import WorkerSeat
from proxy.serving.app import FleetProxyApp, create_app
from proxy.serving.front_door import uvicorn_config
from proxy.settings import Settings, load_settings
from tests.support.polling import eventually


def fast_settings(backends: list[str], **extra: Any) -> Settings:
    base: dict[str, Any] = {
        "backends": backends,
        "scrape_interval": 0.05,
        "health_interval": 0.1,
        "stale_after": 1.0,
    }
    base.update(extra)
    return load_settings(base)


@contextlib.asynccontextmanager
async def running_proxy(
    settings: Settings, *, wait_ready: bool = True, seat: WorkerSeat | None = None
) -> AsyncIterator[tuple[str, FleetProxyApp]]:
    """`seat`: one of several workers (two such proxies in one test share their load and
    queues as `--workers 2` processes do)."""
    app = create_app(settings, seat=seat)
    # The serving configuration of `fleet-proxy serve`, on a free port in the test's loop, on
    # the settings' listen address (127.0.0.1 unless a test asks for another); the tests
    # connect through 127.0.0.1 either way.
    config = uvicorn_config(app, settings, port=0, loop="none", log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:

        def listening() -> bool:
            if not server.started and task.done():
                task.result()  # a failed start raises its own error, at once
            return server.started

        await eventually(listening, within=30, what="the proxy listening")
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        if wait_ready:
            async with httpx.AsyncClient() as client:

                async def ready() -> bool:
                    return (await client.get(url + "/ready")).status_code == 200

                await eventually(ready, within=30, what="the proxy ready", every=0.02)
        yield url, app
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)
