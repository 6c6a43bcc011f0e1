"""`fleet-proxy serve --workers 3` scrapes each backend's /metrics once per scrape interval,
not once per worker, and every worker still routes by the metrics scraped: counted at a fake
backend on a real socket, and read back from each worker's /admin/backends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.integration.test_workers import serve
from tests.support.fake_backend import FakeBackend
from tests.support.polling import eventually

WORKERS = 3


@pytest.fixture
async def backend() -> AsyncIterator[FakeBackend]:
    fake = FakeBackend()
    await fake.start()
    yield fake
    await fake.stop()


def calls(fake: FakeBackend, path: str) -> int:
    return sum(1 for p, _ in fake.authorizations if p == path)


@pytest.mark.slow
async def test_metrics_are_scraped_once_for_all_workers(backend: FakeBackend) -> None:
    # Health checks stay with every worker, at the scrape interval here: per interval each
    # worker checks health once, and only one of them scrapes the metrics.
    env = {"FLEET_PROXY_SCRAPE_INTERVAL": "0.05", "FLEET_PROXY_HEALTH_INTERVAL": "0.05"}
    async with serve([backend.url], workers=WORKERS, env_extra=env):
        backend.authorizations.clear()

        def enough_checks() -> bool:
            return calls(backend, "/health") >= 30 * WORKERS

        await eventually(enough_checks, within=60, what="30 health checks per worker", every=0.05)
        health, metrics = calls(backend, "/health"), calls(backend, "/metrics")
        # One scraper: about health / WORKERS; every worker scraping would give about health.
        assert metrics <= 1.5 * health / WORKERS, (metrics, health)
        assert metrics >= 10


@pytest.mark.slow
async def test_every_worker_sees_the_metrics_one_scraped(backend: FakeBackend) -> None:
    backend.running_metric = 7.0
    async with serve([backend.url], workers=WORKERS) as served:
        seen: set[int] = set()

        async def each_worker_sees_seven() -> bool:
            # A new connection each time: the kernel hands it to any worker, and both calls
            # on it are answered by that one.
            limits = httpx.Limits(max_connections=1)
            async with httpx.AsyncClient(timeout=5, limits=limits) as client:
                with contextlib.suppress(httpx.HTTPError):
                    worker = (await served.workers(client))["answered_by"]
                    r = await client.get(served.url + "/admin/backends")
                    rows = r.json()
                    if rows and all((row["metrics"] or {}).get("running") == 7.0 for row in rows):
                        seen.add(int(worker))
            return len(seen) == WORKERS

        await eventually(
            each_worker_sees_seven, within=60, what="every worker sees running=7", every=0.05
        )
