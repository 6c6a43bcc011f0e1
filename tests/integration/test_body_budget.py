"""The request-body bytes the whole proxy holds are bounded by max_body_bytes_in_flight: a
request whose body finds no room waits body_bytes_wait, then gets an OpenAI-shaped 503 with
retry-after; the bytes come back when requests end. Real sockets, a backend that holds its
answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.support.fake_backend import Behaviour, FakeBackend
from tests.support.polling import eventually
from tests.support.proxy_metrics import body_bytes_in_flight as in_flight
from tests.support.proxy_metrics import metric
from tests.support.servers import fast_settings, running_proxy

MIB = 1024 * 1024


def big_body(tag: str) -> bytes:
    """A completion request of about 1 MiB (a little over 1,000,000 bytes)."""
    return b'{"model": "fake-model", "max_tokens": 2, "prompt": "%s %s"}' % (
        tag.encode(),
        b"x" * 1_000_000,
    )


@pytest.fixture
async def held() -> AsyncIterator[FakeBackend]:
    """A backend that answers a generation request only once the test releases a permit."""
    b = FakeBackend(behaviour=Behaviour(hold=asyncio.Semaphore(0)))
    await b.start()
    yield b
    await b.stop()


async def refusals(c: httpx.AsyncClient) -> float:
    return await metric(c, "fleet_proxy_body_budget_refusals_total")


async def post(c: httpx.AsyncClient, body: bytes) -> httpx.Response:
    return await c.post(
        "/v1/completions", content=body, headers={"content-type": "application/json"}
    )


async def test_bodies_past_the_budget_get_503_and_the_budget_returns_to_zero(
    held: FakeBackend,
) -> None:
    settings = fast_settings(
        [held.url], max_body_bytes=2 * MIB, max_body_bytes_in_flight=3 * MIB, body_bytes_wait=0.2
    )
    async with (
        running_proxy(settings) as (url, _app),
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        bodies = [big_body(f"r{i}") for i in range(3)]
        first = [asyncio.create_task(post(c, b)) for b in bodies]
        await eventually(lambda: held.active == 3, 10, "three requests on the backend")
        assert await in_flight(c) == sum(len(b) for b in bodies)

        # A fourth body (declared length) and a fifth (chunked) find no room.
        late = await post(c, big_body("late"))

        async def chunked() -> AsyncIterator[bytes]:
            body = big_body("chunked")
            for i in range(0, len(body), 64 * 1024):
                yield body[i : i + 64 * 1024]

        late_chunked = await c.post(
            "/v1/completions", content=chunked(), headers={"content-type": "application/json"}
        )
        for r in (late, late_chunked):
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
            error = r.json()["error"]
            assert error["type"] == "service_unavailable"
            assert "max_body_bytes_in_flight" in error["message"]
        assert await refusals(c) == 2
        # The refused ones gave back what they had taken.
        assert await in_flight(c) == sum(len(b) for b in bodies)
        assert held.behaviour.hold is not None
        for _ in range(4):
            held.behaviour.hold.release()
        for r in await asyncio.gather(*first):
            assert r.status_code == 200, r.text

        async def drained() -> bool:
            return await in_flight(c) == 0

        await eventually(drained, 10, "the body budget back to 0")
        ok = await post(c, big_body("after"))
        assert ok.status_code == 200, ok.text
        assert await in_flight(c) == 0


async def test_a_body_waits_for_room_freed_within_body_bytes_wait(held: FakeBackend) -> None:
    settings = fast_settings(
        [held.url], max_body_bytes=2 * MIB, max_body_bytes_in_flight=2 * MIB, body_bytes_wait=30
    )
    async with (
        running_proxy(settings) as (url, _app),
        httpx.AsyncClient(base_url=url, timeout=60) as c,
    ):
        hold = held.behaviour.hold
        assert hold is not None
        first = [asyncio.create_task(post(c, big_body(f"r{i}"))) for i in range(2)]
        await eventually(lambda: held.active == 2, 10, "two requests on the backend")
        waiting = asyncio.create_task(post(c, big_body("waiting")))
        # It waits (not refused) while the budget is full...
        await asyncio.sleep(0.3)
        assert not waiting.done()
        assert held.active == 2
        # ...and goes on as soon as one request ends.
        hold.release()
        await eventually(lambda: held.active == 2 and len(held.seen) == 3, 10, "it got in")
        hold.release()
        hold.release()
        for r in [*await asyncio.gather(*first), await waiting]:
            assert r.status_code == 200, r.text
        assert await refusals(c) == 0
