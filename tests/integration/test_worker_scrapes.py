"""`fleet-proxy serve --workers 3` scrapes each backend's /metrics and checks its health once
per interval, not once per worker, and every worker still routes by the metrics scraped and
the verdicts reached: counted at a fake backend on a real socket, and read back from each
worker's /admin/backends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

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
async def test_metrics_and_health_are_polled_once_for_all_workers(backend: FakeBackend) -> None:
    # /v1/models stays with every worker: at the scrape interval here, it is the yardstick.
    # Per interval each worker asks for the models once, and only one of them scrapes the
    # metrics and checks health.
    env = {
        "FLEET_PROXY_SCRAPE_INTERVAL": "0.05",
        "FLEET_PROXY_HEALTH_INTERVAL": "0.05",
        "FLEET_PROXY_MODELS_INTERVAL": "0.05",
    }
    async with serve([backend.url], workers=WORKERS, env_extra=env):
        backend.authorizations.clear()

        def enough_rounds() -> bool:
            return calls(backend, "/v1/models") >= 30 * WORKERS

        await eventually(enough_rounds, within=60, what="30 model lists per worker", every=0.05)
        models = calls(backend, "/v1/models")
        metrics, health = calls(backend, "/metrics"), calls(backend, "/health")
        # One poller: about models / WORKERS each; every worker polling would give about models.
        assert 10 <= metrics <= 1.5 * models / WORKERS, (metrics, models)
        assert 10 <= health <= 1.5 * models / WORKERS, (health, models)


@pytest.mark.slow
async def test_every_worker_sees_what_one_scraped_and_checked(backend: FakeBackend) -> None:
    backend.running_metric = 7.0
    async with serve([backend.url], workers=WORKERS) as served:

        async def every_worker(what: str, holds: Callable[[dict[str, Any]], bool]) -> None:
            seen: set[int] = set()

            async def each_worker_sees() -> bool:
                # A new connection each time: the kernel hands it to any worker, and both
                # calls on it are answered by that one.
                limits = httpx.Limits(max_connections=1)
                async with httpx.AsyncClient(timeout=5, limits=limits) as client:
                    with contextlib.suppress(httpx.HTTPError):
                        worker = (await served.workers(client))["answered_by"]
                        rows = (await client.get(served.url + "/admin/backends")).json()
                        if rows and all(holds(row) for row in rows):
                            seen.add(int(worker))
                return len(seen) == WORKERS

            await eventually(each_worker_sees, within=60, what=what, every=0.05)

        await every_worker("running=7", lambda row: (row["metrics"] or {}).get("running") == 7)
        backend.behaviour.healthy = False
        await every_worker("the backend unhealthy", lambda row: row["healthy"] is False)
        backend.behaviour.healthy = True
        await every_worker("the backend healthy", lambda row: row["healthy"] is True)
