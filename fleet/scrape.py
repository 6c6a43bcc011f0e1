"""Background polling of every backend's /metrics, health path (/health) and /v1/models.

One loop per backend, so a slow or hung backend never delays the others' snapshots.
Failures never raise out of a loop: a health check's result goes to the owner of backend
health (`HealthReports`, fleet/health.py), which takes the backend out or brings it back; a
failed scrape leaves the snapshot to go stale. With several worker processes a `MetricsShare`
lets one of them scrape /metrics and check health for all (proxy/control/shared_scrapes.py).

/metrics is read several times a second per backend, so its reader is injected
(`MetricsPages`): the proxy reads it over its own HTTP client, whose request costs a fifth of
httpx's in CPU (docs/performance.md); health checks and /v1/models, a few a second at most,
use the httpx client.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Protocol

import httpx
import orjson

from fleet.clock import Clock, to_next_beat
from fleet.health import HealthReports, failure_detail
from fleet.registry import FleetRegistry
from fleet.types import Backend, EngineMetrics, MetricsSnapshot
from fleet.vllm_metrics import parse_engine_metrics


class MetricsShare(Protocol):
    """Polls shared between processes (proxy/control/shared_scrapes.py): one scrapes and
    checks a backend and posts what it found, the others take that instead of polling."""

    def scrapes(self, backend: Backend) -> bool:
        """Whether this process scrapes `backend`'s /metrics itself."""
        ...

    def posted(self, backend: Backend, snapshot: MetricsSnapshot) -> None:
        """This process's scrape of `backend`, for the others."""
        ...

    def newer(self, backend: Backend) -> MetricsSnapshot | None:
        """Another process's scrape of `backend` not yet taken here, if any."""
        ...

    def checks(self, backend: Backend) -> bool:
        """Whether this process checks `backend`'s health itself."""
        ...

    def checked(self, backend: Backend, failure: str, at: float) -> None:
        """This process's health check of `backend` ("" for a pass), for the others."""
        ...

    def verdicts(self, backend: Backend) -> list[str]:
        """Another process's health verdicts on `backend` not yet taken here, oldest first."""
        ...


class PageUnavailable(Exception):
    """A backend page could not be read; the message says why."""


class MetricsPages(Protocol):
    """Reads a backend's Prometheus page, each read bounded by a timeout of its own."""

    async def metrics_page(self, url: str) -> str:
        """The page at `url`, answered 200 in time; else PageUnavailable."""
        ...


class HttpxMetricsPages:
    """`MetricsPages` over an httpx client."""

    def __init__(self, client: httpx.AsyncClient, timeout: float) -> None:
        self.client = client
        self.timeout = timeout

    async def metrics_page(self, url: str) -> str:
        try:
            r = await self.client.get(url, timeout=self.timeout)
            r.raise_for_status()
        except httpx.HTTPError as e:
            raise PageUnavailable(f"{type(e).__name__}: {e}") from e
        return r.text


class Scraper:
    def __init__(
        self,
        registry: FleetRegistry,
        client: httpx.AsyncClient,
        clock: Clock,
        *,
        health: HealthReports,
        pages: MetricsPages | None = None,
        interval: float = 0.2,
        health_interval: float = 1.0,
        models_interval: float = 10.0,
        timeout: float = 1.0,
        health_path: str = "/health",
        share: MetricsShare | None = None,
    ) -> None:
        self.registry = registry
        self.client = client
        self.pages: MetricsPages = (
            pages if pages is not None else HttpxMetricsPages(client, timeout)
        )
        self.clock = clock
        self.interval = interval
        self.health_interval = health_interval
        self.models_interval = models_interval
        self.timeout = timeout
        self.health = health
        # vLLM answers /health; a gateway or another engine in front may check another path.
        self.health_path = health_path
        self.share = share
        self._loops: dict[str, tuple[Backend, asyncio.Task[None]]] = {}  # by backend id

    async def run(self) -> None:
        """Keep one polling loop per registered backend until cancelled."""
        try:
            loop = asyncio.get_running_loop()
            while True:
                self.sync_loops()
                await asyncio.sleep(to_next_beat(loop.time(), self.interval))
        finally:
            for _, task in self._loops.values():
                task.cancel()
            for _, task in self._loops.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def sync_loops(self) -> None:
        current = {b.id: b for b in self.registry}
        for backend_id in list(self._loops):
            polled, task = self._loops[backend_id]
            # A backend removed and added again under the same id is a new object: its old
            # loop would poll the object nobody routes to any more.
            if current.get(backend_id) is not polled or task.done():
                self._loops.pop(backend_id)[1].cancel()
        for backend_id, backend in current.items():
            if backend_id not in self._loops:
                task = asyncio.create_task(self._poll(backend), name=f"scrape:{backend_id}")
                self._loops[backend_id] = (backend, task)

    async def _poll(self, backend: Backend) -> None:
        next_health = 0.0
        next_models = 0.0
        loop = asyncio.get_running_loop()
        while True:
            now = self.clock.now()
            share = self.share
            follows = share is not None and not share.checks(backend)
            if follows or now >= next_health:
                was_healthy = backend.healthy
                if share is not None and follows:
                    for failure in share.verdicts(backend):
                        self.report(backend, failure)
                else:
                    await self.check_health(backend)
                    next_health = now + self.health_interval
                if backend.healthy and (not was_healthy or not backend.spec.models):
                    next_models = now  # (re)learn models as soon as a backend comes back
            if backend.healthy and now >= next_models:
                await self.learn_models(backend)
                next_models = now + self.models_interval
            if backend.healthy:
                await self.refresh_metrics(backend)
            if follows:
                # Reads of the first worker's results, cheap: every backend's loop wakes this
                # worker once per interval, on the beat.
                await asyncio.sleep(to_next_beat(loop.time(), self.interval))
            else:
                # Own scrapes stay spread over the interval: their parses, taken together,
                # would stall the event loop for every request at once.
                await asyncio.sleep(self.interval)

    async def refresh_metrics(self, backend: Backend) -> None:
        share = self.share
        if share is None:
            await self.scrape_metrics(backend)
            return
        taken = share.newer(backend)
        if taken is not None:
            self.take(backend, taken)
        elif share.scrapes(backend):
            await self.scrape_metrics(backend)

    async def check_health(self, backend: Backend) -> None:
        try:
            r = await self.client.get(backend.url + self.health_path, timeout=self.timeout)
        except httpx.HTTPError as e:
            failure = f"{self.health_path} failed: {failure_detail(e)}"
        else:
            ok = r.status_code == 200
            failure = "" if ok else f"{self.health_path} answered {r.status_code}"
        self.report(backend, failure)
        if self.share is not None:
            self.share.checked(backend, failure, self.clock.now())

    def report(self, backend: Backend, failure: str) -> None:
        """A health check's verdict ("" for a pass) to the owner of backend health."""
        if failure:
            self.health.check_failed(backend, failure)
        else:
            self.health.check_passed(backend)

    async def learn_models(self, backend: Backend) -> None:
        try:
            r = await self.client.get(backend.url + "/v1/models", timeout=self.timeout)
            r.raise_for_status()
            data = orjson.loads(r.content)
            cards = data.get("data", [])
            models = tuple(str(m["id"]) for m in cards if "id" in m)
            adapters = frozenset(str(m["id"]) for m in cards if "id" in m and m.get("parent"))
            lengths = [m.get("max_model_len") for m in cards]
        except (httpx.HTTPError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            backend.last_error = f"/v1/models failed: {type(e).__name__}: {e}"
            return
        if models:
            self.registry.models_learned(backend, models, adapters)
        known = [n for n in lengths if isinstance(n, int) and not isinstance(n, bool) and n > 0]
        backend.max_model_len = min(known) if known else None

    async def scrape_metrics(self, backend: Backend) -> None:
        # A failure leaves the snapshot its old time, so it goes stale on its own.
        try:
            text = await self.pages.metrics_page(backend.url + "/metrics")
        except PageUnavailable as e:
            backend.last_error = f"/metrics failed: {e}"
            return
        try:
            metrics = parse_engine_metrics(text)
        except ValueError as e:
            backend.last_error = f"/metrics failed: {type(e).__name__}: {e}"
            return
        snapshot = MetricsSnapshot(taken_at=self.clock.now(), metrics=metrics)
        self.take(backend, snapshot)
        if self.share is not None:
            self.share.posted(backend, snapshot)

    @staticmethod
    def take(backend: Backend, snapshot: MetricsSnapshot) -> None:
        load = backend.load
        snapshot = replace(snapshot, in_flight=load.in_flight + load.peer_in_flight)
        previous = backend.snapshot
        if previous is not None and _worked(previous.metrics, snapshot.metrics):
            backend.progress_at = snapshot.taken_at
        backend.previous_snapshot = previous
        backend.snapshot = snapshot


def _worked(before: EngineMetrics, after: EngineMetrics) -> bool:
    """Whether the engine did work between two scrapes (a restarted engine's counters fall)."""
    return (
        after.steps != before.steps
        or after.generation_tokens != before.generation_tokens
        or after.prompt_tokens != before.prompt_tokens
    )
