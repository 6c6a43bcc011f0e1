"""The request metrics' `model` label and the process metrics, from a real proxy's /metrics."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry

from proxy.metrics import RouterMetrics
from tests.support.servers import fast_settings, running_proxy


async def test_request_series_carry_the_served_model_and_made_up_names_count_as_unknown(
    backend,
):
    async with (
        running_proxy(fast_settings([backend.url])) as (url, app),
        httpx.AsyncClient(base_url=url) as c,
    ):
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 2}
        assert (await c.post("/v1/completions", json=body)).status_code == 200
        assert (await c.post("/v1/completions", json={**body, "stream": True})).status_code == 200
        for i in range(3):
            r = await c.post("/v1/completions", json={**body, "model": f"made-up-{i}"})
            assert r.status_code == 404
        text = (await c.get("/metrics")).text
    prom = app.core.prom
    served = {"endpoint": "completions", "model": "fake-model"}
    assert prom.get_sample_value("fleet_proxy_requests_total", {**served, "status": "200"}) == 2
    unknown = {"endpoint": "completions", "model": "unknown", "status": "404"}
    assert prom.get_sample_value("fleet_proxy_requests_total", unknown) == 3
    assert prom.get_sample_value("fleet_proxy_request_duration_seconds_count", served) == 2
    assert prom.get_sample_value("fleet_proxy_time_to_first_byte_seconds_count", served) == 1
    assert "made-up" not in text


def test_a_client_cannot_grow_the_series_with_model_names() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, lambda m: m == "served")
    for i in range(1000):
        metrics.count_request("completions", 404, f"name-{i}")
    metrics.count_request("completions", 400, None)
    metrics.count_request("completions", 200, "served")
    samples = [
        s
        for family in registry.collect()
        if family.name == "fleet_proxy_requests"
        for s in family.samples
        if s.name == "fleet_proxy_requests_total"
    ]
    assert sorted((s.labels["model"], s.labels["status"], s.value) for s in samples) == [
        ("served", "200", 1.0),
        ("unknown", "400", 1.0),
        ("unknown", "404", 1000.0),
    ]
    assert len(metrics._request_children) == 3


async def test_metrics_carry_the_process_and_python_series(backend):
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        text = (await c.get("/metrics")).text
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "python_info{",
        "python_gc_objects_collected_total{",
    ):
        assert name in text, name
