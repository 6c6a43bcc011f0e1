"""`fleet-proxy plan --metrics-port`: the standalone planner's `/metrics` (Prometheus text, its
own registry) and `/status` (`PlannerLoop.status()` as JSON) on a small aiohttp server in the
planner's event loop, started and stopped with it."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def status_app(
    status: Callable[[], dict[str, Any]], registry: CollectorRegistry
) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"content-type": CONTENT_TYPE_LATEST}
        )

    async def status_view(_: web.Request) -> web.Response:
        return web.json_response(status(), dumps=lambda o: json.dumps(o, default=str))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status_view)
    return app


@contextlib.asynccontextmanager
async def serving_status(
    status: Callable[[], dict[str, Any]], registry: CollectorRegistry, host: str, port: int
) -> AsyncIterator[int]:
    """Serve until the block ends; yields the port (the one bound when `port` is 0)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    runner = web.AppRunner(status_app(status, registry), access_log=None)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        yield int(sock.getsockname()[1])
    finally:
        await runner.cleanup()
        sock.close()
