"""The request counters travel from the proxy's backend view to the planner's BackendStatus."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from fleet.types import Backend, BackendSpec, EngineMetrics, MetricsSnapshot, Role
from planner.proxy_admin import BackendStatus, HttpProxyAdmin
from planner.traffic import BackendReading, RequestCounters
from proxy.control.admin_backends import backend_view


async def backends_seen(views: list[dict[str, Any]]) -> list[BackendStatus]:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/admin/backends"
        return httpx.Response(200, content=orjson.dumps(views))

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        return list(await HttpProxyAdmin(client, "http://127.0.0.1:9").backends())


async def test_counters_of_a_scraped_backend() -> None:
    metrics = EngineMetrics(
        running=3,
        requests_finished=12,
        prompt_len_sum=12_000,
        prompt_len_count=12,
        output_len_sum=1_200,
        output_len_count=12,
        ttft_sum=2.4,
        ttft_count=12,
        itl_sum=30,
        itl_count=1_188,
    )
    backend = Backend(BackendSpec("d0", "http://127.0.0.1:8001", Role.DECODE))
    backend.snapshot = MetricsSnapshot(taken_at=5.0, metrics=metrics)
    (status,) = await backends_seen([backend_view(backend, now=5.0, stale_after=10.0)])
    expected = RequestCounters(12, 12_000, 12, 1_200, 12, 2.4, 12, 30, 1_188)
    assert status.counters == expected
    assert status.reading() == BackendReading("d0", Role.DECODE, 3.0, expected)


async def test_no_counters_before_the_first_scrape_or_from_an_older_proxy() -> None:
    unscraped = backend_view(Backend(BackendSpec("d0", "http://127.0.0.1:8001")), 0.0, 10.0)
    older = {"id": "d1", "url": "u", "metrics": {"waiting": 0, "kv_usage": 0.5, "running": 1}}
    a, b = await backends_seen([unscraped, older])
    assert a.reading() is None and b.reading() is None
    assert b.kv_usage == 0.5
