"""Admission control on a real proxy in front of a backend that answers only when let."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from proxy.request.entry import Forwarder
from proxy.serving.admission import AdmittedHandler
from tests.support.fake_backend import Behaviour, FakeBackend
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

BODY = {"model": "fake-model", "prompt": "hello", "max_tokens": 4}


@pytest.fixture
async def held() -> AsyncIterator[FakeBackend]:
    backend = FakeBackend(behaviour=Behaviour(hold=asyncio.Semaphore(0)))
    await backend.start()
    yield backend
    let(backend.behaviour.hold, 1000)  # nothing left waiting on the way out
    await backend.stop()


def let(hold: asyncio.Semaphore | None, n: int) -> None:
    """Let `n` held requests answer."""
    assert hold is not None
    for _ in range(n):
        hold.release()


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


async def test_past_the_limit_requests_queue_then_get_429_and_a_waiter_proceeds(held):
    settings = fast_settings(
        [held.url], max_concurrent_requests=2, admission_queue_size=1, admission_queue_timeout=60
    )
    hold = held.behaviour.hold
    assert hold is not None
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        gate = app.admission
        assert gate is not None
        first = [asyncio.create_task(c.post("/v1/completions", json=BODY)) for _ in range(2)]
        await eventually(lambda: held.active == 2, what="two requests at the backend")
        third = asyncio.create_task(c.post("/v1/completions", json=BODY))
        await eventually(lambda: gate.waiting == 1, what="one request queued")

        refused = await c.post("/v1/completions", json=BODY)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error"
        assert error["code"] == "queue_full"
        assert "at capacity" in error["message"]
        metrics = (await c.get("/metrics")).text
        assert metric(metrics, 'fleet_proxy_admission_rejected_total{reason="queue_full"}') == 1
        assert metric(metrics, 'fleet_proxy_admission_rejected_total{reason="queue_timeout"}') == 0
        assert metric(metrics, "fleet_proxy_admission_waiting") == 1
        assert metric(metrics, "fleet_proxy_admission_running") == 2
        assert held.active == 2  # the queued request never reached the backend

        let(hold, 1)  # one running request finishes: its slot goes to the waiter
        await eventually(lambda: len(held.seen) == 3, what="the queued request at the backend")
        assert gate.waiting == 0
        assert gate.running == 2
        let(hold, 2)
        answers = await asyncio.gather(*first, third)
        assert [r.status_code for r in answers] == [200, 200, 200]
        await eventually(lambda: gate.running == 0, what="every slot given back")
        metrics = (await c.get("/metrics")).text
        assert 'status="429"' in metrics


async def test_a_request_waiting_past_the_timeout_gets_429(held):
    settings = fast_settings(
        [held.url], max_concurrent_requests=1, admission_queue_size=4, admission_queue_timeout=0.2
    )
    hold = held.behaviour.hold
    assert hold is not None
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        running = asyncio.create_task(c.post("/v1/completions", json=BODY))
        await eventually(lambda: held.active == 1, what="one request at the backend")
        waited = await c.post("/v1/completions", json=BODY)
        assert waited.status_code == 429
        assert waited.json()["error"]["code"] == "queue_timeout"
        assert app.admission is not None and app.admission.waiting == 0
        metrics = (await c.get("/metrics")).text
        assert metric(metrics, 'fleet_proxy_admission_rejected_total{reason="queue_timeout"}') == 1
        let(hold, 1)
        assert (await running).status_code == 200


async def test_a_queued_request_whose_client_leaves_gives_up_its_place(held):
    settings = fast_settings([held.url], max_concurrent_requests=1, admission_queue_size=1)
    hold = held.behaviour.hold
    assert hold is not None
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        gate = app.admission
        assert gate is not None
        running = asyncio.create_task(c.post("/v1/completions", json=BODY))
        await eventually(lambda: held.active == 1, what="one request at the backend")
        async with httpx.AsyncClient(base_url=url) as leaving:
            queued = asyncio.create_task(leaving.post("/v1/completions", json=BODY))
            await eventually(lambda: gate.waiting == 1, what="one request queued")
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
        let(hold, 1)
        assert (await running).status_code == 200
        # The slot reached the queued request, which found its client gone, and came back.
        await eventually(lambda: gate.running == 0 and gate.waiting == 0, what="the gate empty")
        let(hold, 1)
        assert (await c.post("/v1/completions", json=BODY)).status_code == 200


async def test_off_by_default_the_handler_is_unwrapped(held):
    async with running_proxy(fast_settings([held.url])) as (_, app):
        assert app.admission is None
        assert type(app.forwarder) is Forwarder
        assert not isinstance(app.forwarder, AdmittedHandler)
