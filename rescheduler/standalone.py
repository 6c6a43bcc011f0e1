"""`fleet-proxy reschedule --proxy URL`: the rescheduler on its own, driving a running proxy
through its admin API: the view from GET /admin/rescheduler/view, each move through
POST /admin/requests/{upstream id}/migrate. The loop and the decision are the colocated
rescheduler's (rescheduler/loop.py).

Its metrics live in a registry of its own, served on 127.0.0.1:`metrics_port` when one is
given; without one, the loop's info line per migrating cycle is the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

import httpx
from prometheus_client import CollectorRegistry, start_http_server

from rescheduler.config import ReschedulerConfig
from rescheduler.decide import check_config
from rescheduler.executor import BoundedExecutor
from rescheduler.loop import ReschedulerLoop
from rescheduler.metrics import ReschedulerMetrics
from rescheduler.view import ClusterView
from rescheduler.wire import view_from_json

log = logging.getLogger("fleet_proxy.rescheduler")


class StandaloneSettings(Protocol):
    """What this process reads of its settings (the proxy's Settings has all of it): declared
    here so the rescheduler does not import the proxy."""

    @property
    def rescheduling_interval_ms(self) -> int: ...

    @property
    def rescheduling_migration_timeout(self) -> float: ...

    @property
    def rescheduling_max_concurrent_migrations(self) -> int: ...

    @property
    def rescheduling_history(self) -> int: ...

    def rescheduler_config(self, workers: int = 1) -> ReschedulerConfig: ...


class AdminViewSource:
    def __init__(self, client: httpx.AsyncClient, proxy_url: str) -> None:
        self.client = client
        self.url = proxy_url.rstrip("/") + "/admin/rescheduler/view"

    async def view(self) -> ClusterView:
        r = await self.client.get(self.url)
        r.raise_for_status()
        return view_from_json(r.json())


class AdminMover:
    def __init__(self, client: httpx.AsyncClient, proxy_url: str, timeout: float) -> None:
        self.client = client
        self.base = proxy_url.rstrip("/")
        self.timeout = timeout

    async def move(self, key: str, source: str, target: str, reason: str) -> tuple[str, str]:
        body = {"to": target, "reason": reason, "source": source, "timeout": self.timeout}
        r = await self.client.post(
            f"{self.base}/admin/requests/{key}/migrate", json=body, timeout=self.timeout + 5
        )
        data: Any = (
            r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        )
        if r.status_code == 404:
            message = _message(data)
            if "no live request" in message:
                return "finished", "no longer live"
            return "failed", message or "HTTP 404"
        if r.status_code in (200, 409) and isinstance(data, dict) and "outcome" in data:
            outcome = str(data["outcome"])
            # The proxy answers `pending` when the move outlived the wait it was given.
            return ("timeout" if outcome == "pending" else outcome), str(data.get("detail", ""))
        return "failed", f"HTTP {r.status_code}: {_message(data) or r.text[:200]}"


def _message(data: Any) -> str:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message", ""))
        return str(data.get("detail", ""))
    return ""


def build_standalone(
    settings: StandaloneSettings,
    client: httpx.AsyncClient,
    proxy_url: str,
    registry: CollectorRegistry,
) -> ReschedulerLoop:
    config = settings.rescheduler_config()
    check_config(config)
    metrics = ReschedulerMetrics(registry)
    executor = BoundedExecutor(
        AdminMover(client, proxy_url, settings.rescheduling_migration_timeout),
        metrics,
        max_concurrent=settings.rescheduling_max_concurrent_migrations,
        timeout=settings.rescheduling_migration_timeout,
    )
    return ReschedulerLoop(
        AdminViewSource(client, proxy_url),
        executor,
        config,
        metrics,
        interval_s=settings.rescheduling_interval_ms / 1000.0,
        history=settings.rescheduling_history,
    )


async def run_standalone(
    settings: StandaloneSettings, proxy_url: str, admin_token: str | None, metrics_port: int | None
) -> None:
    registry = CollectorRegistry(auto_describe=True)
    if metrics_port is not None:
        start_http_server(metrics_port, addr="127.0.0.1", registry=registry)
        log.info("rescheduler metrics on http://127.0.0.1:%d/metrics", metrics_port)
    headers = {"x-admin-token": admin_token} if admin_token else {}
    limits = httpx.Limits(max_connections=settings.rescheduling_max_concurrent_migrations + 2)
    async with httpx.AsyncClient(headers=headers, timeout=10.0, limits=limits) as client:
        loop = build_standalone(settings, client, proxy_url, registry)
        log.info("rescheduling %s every %d ms", proxy_url, settings.rescheduling_interval_ms)
        await loop.run()


def main(
    settings: StandaloneSettings, proxy_url: str, admin_token: str | None, metrics_port: int | None
) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_standalone(settings, proxy_url, admin_token, metrics_port))
    return 0
