"""Safe defaults and outcome-based ejection, against the real proxy on real sockets."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.support.fake_backend import Behaviour, FakeBackend
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

BODY = {"model": "fake-model", "prompt": "hi", "max_tokens": 4}


@pytest.fixture
async def good() -> AsyncIterator[FakeBackend]:
    b = FakeBackend()
    await b.start()
    yield b
    await b.stop()


@pytest.fixture
async def bad() -> AsyncIterator[FakeBackend]:
    b = FakeBackend()
    await b.start()
    yield b
    await b.stop()


def backend_id(b: FakeBackend) -> str:
    return b.url.split("//", 1)[1]


async def backend_row(c: httpx.AsyncClient, b: FakeBackend) -> dict[str, Any]:
    rows = (await c.get("/admin/backends")).json()
    return next(r for r in rows if r["url"] == b.url)


async def post_until_ejected(
    c: httpx.AsyncClient, b: FakeBackend, in_a_row: int, limit_s: float = 20.0
) -> dict[str, Any]:
    """Send requests (each must succeed, retried past `b`) until `b` is ejected for the
    `in_a_row`th time; its admin row then."""

    async def ejected_row() -> dict[str, Any] | None:
        r = await c.post("/v1/completions", json=BODY)
        assert r.status_code == 200, r.text
        row = await backend_row(c, b)
        ejection = row["ejection"]
        return row if ejection is not None and ejection["in_a_row"] == in_a_row else None

    return await eventually(
        ejected_row, limit_s, f"{b.url} ejected for the {in_a_row}th time", every=0.02
    )


# --- the admin API is safe by default


async def test_admin_without_a_token_answers_loopback_clients_only(good: FakeBackend) -> None:
    async with running_proxy(fast_settings([good.url])) as (url, app):
        async with httpx.AsyncClient(base_url=url) as local:
            assert (await local.get("/admin/backends")).status_code == 200
        # The same app, as a client from another machine reaches it.
        far = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
        async with httpx.AsyncClient(transport=far, base_url="http://proxy") as remote:
            r = await remote.get("/admin/backends")
            assert r.status_code == 403
            assert "loopback" in r.text
            r = await remote.post("/admin/backends", json={"url": "http://10.9.9.9:8000"})
            assert r.status_code == 403
        # A token opens it to every client that has it.
    async with running_proxy(fast_settings([good.url], admin_token="s3cret")) as (url, app):
        far = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
        async with httpx.AsyncClient(transport=far, base_url="http://proxy") as remote:
            assert (await remote.get("/admin/backends")).status_code == 401
            r = await remote.get("/admin/backends", headers={"x-admin-token": "s3cret"})
            assert r.status_code == 200


async def test_admin_refuses_backend_urls_outside_the_allow_list(
    good: FakeBackend, bad: FakeBackend
) -> None:
    async with (
        running_proxy(fast_settings([good.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        for target in (
            "http://169.254.169.254",  # a cloud metadata service
            "http://8.8.8.8:8000",
            "http://0.0.0.0:8000",
        ):
            r = await c.post("/admin/backends", json={"url": target})
            assert r.status_code == 403, (target, r.text)
            assert "refused" in r.text
        r = await c.post("/admin/backends", json={"url": "http://user:pw@127.0.0.1:1"})
        assert r.status_code == 400
        assert "credentials" in r.text
        assert len((await c.get("/admin/backends")).json()) == 1
        # A name resolving to loopback only is inside the default allow-list.
        port = bad.url.rsplit(":", 1)[1]
        r = await c.post("/admin/backends", json={"url": f"http://localhost:{port}", "id": "b"})
        assert r.status_code == 201, r.text


# --- what clients learn


async def test_debug_receipts_need_the_operator_flag(good: FakeBackend) -> None:
    debug = {"x-fleet-debug": "1"}
    async with (
        running_proxy(fast_settings([good.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        r = await c.post("/v1/completions", json=BODY, headers=debug)
        assert r.status_code == 200
        assert "x-fleet-decision" not in r.headers
    async with (
        running_proxy(fast_settings([good.url], debug_receipts=True)) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        r = await c.post("/v1/completions", json=BODY, headers=debug)
        assert "x-fleet-decision" in r.headers


async def test_error_messages_name_no_backend_unless_asked(bad: FakeBackend) -> None:
    bad.behaviour = Behaviour(fail_status=500)
    for details in (False, True):
        # Every attempt made (no stop after backends failing in a row), and stopped after two.
        for in_a_row, said in ((0, "no backend answered after 3 attempt(s)"), (2, "the request")):
            settings = fast_settings(
                [bad.url],
                error_details=details,
                outlier_detection=False,
                max_backends_failed_in_a_row=in_a_row,
            )
            async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
                r = await c.post("/v1/completions", json=BODY)
                assert r.status_code == 502
                message = r.json()["error"]["message"]
                assert message.startswith(said)
                assert (backend_id(bad) in message) is details
                assert ("injected" in message) is details


async def test_backend_header_can_be_turned_off(good: FakeBackend) -> None:
    async with (
        running_proxy(fast_settings([good.url], backend_header=False)) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        r = await c.post("/v1/completions", json=BODY)
        assert r.status_code == 200
        assert "x-fleet-backend" not in r.headers
        stream = await c.post("/v1/completions", json={**BODY, "stream": True})
        assert "x-fleet-backend" not in stream.headers


# --- what backends receive


async def test_headers_named_in_connection_stay_on_the_clients_hop(good: FakeBackend) -> None:
    async with (
        running_proxy(fast_settings([good.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        headers = {"connection": "keep-alive, X-Hop-Secret", "x-hop-secret": "1", "x-end": "2"}
        r = await c.post("/v1/completions", json=BODY, headers=headers)
        assert r.status_code == 200
        seen = good.seen[-1].headers
        assert "x-hop-secret" not in seen
        assert seen["x-end"] == "2"


async def test_every_leg_has_its_own_upstream_request_id(
    good: FakeBackend, bad: FakeBackend
) -> None:
    bad.behaviour = Behaviour(fail_status=500)
    settings = fast_settings([bad.url, good.url], policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        for _ in range(2):
            r = await c.post("/v1/completions", json=BODY, headers={"x-request-id": "same"})
            assert r.status_code == 200
            assert r.headers["x-request-id"] == "same"
    ids = [s.headers["x-request-id"] for s in bad.seen + good.seen]
    assert len(ids) == len(set(ids)), ids
    for i in ids:
        assert re.fullmatch(r"same-[0-9a-f]{12}(-\d+)?", i), i
    # A retry keeps the first attempt's id as its prefix.
    retried = [i for i in (s.headers["x-request-id"] for s in good.seen) if i.endswith("-1")]
    assert retried and any(s.headers["x-request-id"] == retried[0][:-2] for s in bad.seen)


# --- outcome-based ejection


async def test_a_backend_answering_500_to_everything_is_ejected(
    good: FakeBackend, bad: FakeBackend
) -> None:
    bad.behaviour = Behaviour(fail_status=500)
    settings = fast_settings(
        [bad.url, good.url],
        policy="least_requests",
        outlier_consecutive_failures=3,
        outlier_base_ejection=60.0,
    )
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        row = await post_until_ejected(c, bad, 1)
        assert row["healthy"] is True  # its /health still answers
        assert row["routable"] is False
        assert row["ejection"]["reason"] == "status"
        assert row["ejection"]["in_a_row"] == 1
        assert len(bad.seen) == 3
        for _ in range(10):
            assert (await c.post("/v1/completions", json=BODY)).status_code == 200
        assert len(bad.seen) == 3  # ejected: no request pays a retry any more
        metrics = (await c.get("/metrics")).text
        line = f'fleet_proxy_backend_ejections_total{{backend="{backend_id(bad)}",reason="status"}}'
        assert f"{line} 1.0" in metrics
        assert f'fleet_proxy_backend_ejected{{backend="{backend_id(bad)}"' in metrics


async def test_an_ejected_backend_returns_on_probation_and_backs_off_longer(
    good: FakeBackend, bad: FakeBackend
) -> None:
    bad.behaviour = Behaviour(fail_status=500)
    settings = fast_settings(
        [bad.url, good.url],
        policy="round_robin",
        outlier_consecutive_failures=2,
        outlier_base_ejection=0.3,
    )
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        await post_until_ejected(c, bad, 1)
        # Back after 0.3 s; still failing, its first failure ejects it again, for twice as long.
        row = await post_until_ejected(c, bad, 2)
        assert row["ejection"]["seconds_left"] <= 0.6


async def test_a_backend_that_takes_requests_and_never_answers_is_left_at_once(
    good: FakeBackend, bad: FakeBackend
) -> None:
    # Its /health and /metrics answer; its generation requests never do.
    bad.behaviour = Behaviour(first_byte_delay=3600)
    settings = fast_settings(
        [bad.url, good.url], policy="round_robin", stall_timeout=0.5, read_timeout=600
    )
    async with (
        running_proxy(settings) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=60) as c,
    ):
        plain = [c.post("/v1/completions", json=BODY) for _ in range(2)]
        streamed = [c.post("/v1/completions", json={**BODY, "stream": True}) for _ in range(2)]
        answers = await asyncio.gather(*plain, *streamed)
        assert [r.status_code for r in answers] == [200] * 4
        assert all(r.text.endswith("data: [DONE]\n\n") for r in answers[2:])
        assert bad.seen, "round-robin never sent a request to the stalled backend"
        row = await backend_row(c, bad)
        assert row["ejection"] is not None and row["ejection"]["reason"] == "stalled"
        assert row["healthy"] is True


async def test_a_removed_backend_leaves_no_series_or_connections(
    good: FakeBackend, bad: FakeBackend
) -> None:
    bad.behaviour = Behaviour(fail_status=500)
    settings = fast_settings([bad.url, good.url], policy="round_robin")
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        for _ in range(4):
            await c.post("/v1/completions", json=BODY)
        pool = app.core.upstream_pool()
        assert bad.url in pool.origins()
        series = f'backend="{backend_id(bad)}"'
        errors = [
            line
            for line in (await c.get("/metrics")).text.splitlines()
            if line.startswith("fleet_proxy_upstream_errors_total") and series in line
        ]
        assert errors
        assert (await c.delete(f"/admin/backends/{backend_id(bad)}")).status_code == 200
        assert series not in (await c.get("/metrics")).text
        # Its idle keep-alive connections are closed and its origin forgotten.
        assert pool.origins() == [good.url]
