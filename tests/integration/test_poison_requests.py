"""A request that makes every backend it reaches fail (a poison prompt that wedges or crashes
an engine) is stopped after max_backends_failed_in_a_row of them, with a clear OpenAI-shaped
error, rather than tried on each backend in turn until the whole fleet is down; the later
failures are not held against their backends. Real sockets, fake backends that drop a request
holding a marker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from proxy.settings import Settings
from tests.support.fake_backend import Behaviour, FakeBackend
from tests.support.servers import fast_settings, running_proxy

POISON = "POISON-PILL"


@pytest.fixture
async def fleet(request: pytest.FixtureRequest) -> AsyncIterator[list[FakeBackend]]:
    mode = getattr(request, "param", "drop")
    backends = [FakeBackend(behaviour=Behaviour(poison=POISON, poison_mode=mode)) for _ in range(3)]
    for b in backends:
        await b.start()
    yield backends
    for b in backends:
        await b.stop()


def poisoned_seen(fleet: list[FakeBackend]) -> int:
    return sum(1 for b in fleet for s in b.seen if POISON in str(s.body.get("prompt")))


async def metric(c: httpx.AsyncClient, name: str) -> float:
    for line in (await c.get("/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def settings(fleet: list[FakeBackend]) -> Settings:
    # One failure held against a backend ejects it: the test sees which failures were held.
    return fast_settings(
        [b.url for b in fleet],
        max_attempts=3,
        outlier_consecutive_failures=1,
        outlier_base_ejection=60.0,
        outlier_max_ejected_fraction=1.0,
    )


async def ejected(c: httpx.AsyncClient) -> list[str]:
    return [r["url"] for r in (await c.get("/admin/backends")).json() if r["ejection"]]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_poison_request_reaches_two_backends_and_gets_a_clear_502(
    fleet: list[FakeBackend], stream: bool
) -> None:
    async with (
        running_proxy(settings(fleet)) as (url, _app),
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        body = {"model": "fake-model", "prompt": f"a {POISON}", "max_tokens": 4, "stream": stream}
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 502, r.text
        error = r.json()["error"]
        assert error["type"] == "upstream_error"
        assert "failed on 2 backends in a row" in error["message"]
        assert "not sent to another" in error["message"]
        assert poisoned_seen(fleet) == 2
        name = 'fleet_proxy_requests_failed_in_a_row_total{stage="first"}'
        assert await metric(c, name) == 1
        # Only the first backend's failure was held against it: the second failed under a
        # request that had already failed elsewhere.
        assert len(await ejected(c)) == 1
        rows = (await c.get("/admin/backends")).json()
        assert all(row["healthy"] for row in rows)
        # The fleet still serves everyone else.
        for _ in range(4):
            ok = await c.post("/v1/completions", json={**body, "prompt": "hello"})
            assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("fleet", ["cut"], indirect=True)
async def test_a_stream_cut_on_each_backend_stops_after_two(fleet: list[FakeBackend]) -> None:
    """Each backend answers the poison stream's head, then drops it: the stream is sent again
    (nothing reached the client yet) on one more backend only, then ends with an error event."""
    async with (
        running_proxy(settings(fleet)) as (url, _app),
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        body = {"model": "fake-model", "prompt": f"a {POISON}", "max_tokens": 4, "stream": True}
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200  # the head had gone out
        assert "failed on 2 backends in a row" in r.text
        assert '"error"' in r.text
        assert poisoned_seen(fleet) == 2
        name = 'fleet_proxy_requests_failed_in_a_row_total{stage="continuation"}'
        assert await metric(c, name) == 1
        rows = (await c.get("/admin/backends")).json()
        # The first backend is taken out for the broken stream; the second, which broke under
        # a request that had already broken another, is not.
        assert sum(1 for row in rows if row["healthy"] and not row["ejection"]) == 2
        ok = await c.post("/v1/completions", json={**body, "prompt": "hello"})
        assert ok.status_code == 200
        assert ok.text.rstrip().endswith("data: [DONE]")
