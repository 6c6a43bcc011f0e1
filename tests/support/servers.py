"""Run the real proxy under uvicorn on an ephemeral port inside the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn

from proxy.serving.app import FleetProxyApp, create_app
from proxy.serving.front_door import uvicorn_config
from proxy.settings import Settings, load_settings


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
    settings: Settings, *, wait_ready: bool = True
) -> AsyncIterator[tuple[str, FleetProxyApp]]:
    app = create_app(settings)
    # The serving configuration of `fleet-proxy serve`, on a free port in the test's loop, on
    # the settings' listen address (127.0.0.1 unless a test asks for another); the tests
    # connect through 127.0.0.1 either way.
    config = uvicorn_config(app, settings, port=0, loop="none", log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started:
                break
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        if wait_ready:
            async with httpx.AsyncClient() as client:
                for _ in range(300):
                    r = await client.get(url + "/ready")
                    if r.status_code == 200:
                        break
                    await asyncio.sleep(0.02)
                else:
                    raise RuntimeError("proxy never became ready")
        yield url, app
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)
