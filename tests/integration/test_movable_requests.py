"""Movable requests, end to end on real sockets: simulated engines break, stall or are drained
mid-stream, and the client still gets one uninterrupted, token-exact answer.

The simulator's model is a deterministic function of the context, so an uninterrupted run on
one engine is the reference every moved stream must equal (text, token ids, usage).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from simulator.fleet import SimFleet, start_fleet
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
TOKENS = 160  # long enough that a move lands mid-stream on a loaded machine


@dataclass
class Streamed:
    status: int
    headers: httpx.Headers
    events: list[dict[str, Any]] = field(default_factory=list)
    raw: bytes = b""
    done: int = 0  # [DONE] events seen

    @property
    def text(self) -> str:
        parts = []
        for e in self.events:
            for c in e.get("choices", []):
                parts.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
        return "".join(parts)

    @property
    def token_ids(self) -> list[int]:
        return [
            t for e in self.events for c in e.get("choices", []) for t in c.get("token_ids") or []
        ]

    @property
    def usage(self) -> dict[str, Any] | None:
        found = [e["usage"] for e in self.events if e.get("usage")]
        return found[-1] if found else None

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if "error" in e]


async def stream(
    client: httpx.AsyncClient,
    url: str,
    path: str,
    body: dict[str, Any],
    *,
    after: int = -1,
    action: Callable[[Streamed], Awaitable[None]] | None = None,
    headers: dict[str, str] | None = None,
) -> Streamed:
    """POST a streamed request and read it whole; `action` runs once `after` events arrived."""
    async with client.stream("POST", url + path, json=body, headers=headers) as r:
        out = Streamed(r.status_code, r.headers)
        buf = b""
        async for chunk in r.aiter_bytes():
            out.raw += chunk
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:]
                if payload == b"[DONE]":
                    out.done += 1
                    continue
                out.events.append(orjson.loads(payload))
                if action is not None and len(out.events) == after:
                    await action(out)
        return out


def body_for(path: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    if path == "/v1/completions":
        base["prompt"] = "The quick brown fox jumps over the lazy dog, and then"
    else:
        base["messages"] = [{"role": "user", "content": "Tell me about the morning light."}]
    base.update(extra)
    return base


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(3, speed=1.0) as f:
        yield f


def backends(f: SimFleet) -> list[dict[str, str]]:
    return [{"url": u, "id": f"e{i}"} for i, u in enumerate(f.urls)]


def engine_of(f: SimFleet, backend_id: str) -> Any:
    return f.engines[int(backend_id[1:])]


async def set_fault(client: httpx.AsyncClient, f: SimFleet, backend_id: str, **fault: Any) -> None:
    r = await client.post(engine_of(f, backend_id).url + "/_sim/faults", json=fault)
    assert r.status_code == 200, r.text


async def reference(
    client: httpx.AsyncClient, f: SimFleet, path: str, body: dict[str, Any]
) -> Streamed:
    """The same request, uninterrupted, straight to an engine nobody faults."""
    ref = await stream(client, f.urls[2], path, body)
    assert ref.status == 200 and ref.done == 1 and not ref.errors
    return ref


async def migrations(client: httpx.AsyncClient, url: str) -> dict[tuple[str, str], float]:
    text = (await client.get(url + "/metrics")).text
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("fleet_proxy_migrations_total{"):
            labels, value = line[len("fleet_proxy_migrations_total{") :].split("} ")
            kv = dict(p.split("=") for p in labels.split(","))
            out[(kv["reason"].strip('"'), kv["outcome"].strip('"'))] = float(value)
    return out


PATHS = ["/v1/completions", "/v1/chat/completions"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fault", ["die_after_tokens", "cut_stream_after_tokens"])
async def test_a_broken_backend_mid_stream_is_invisible_to_the_client(
    fleet: SimFleet, path: str, fault: str
) -> None:
    settings = fast_settings(backends(fleet)[:2], policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        body = body_for(path, stream_options={"include_usage": True})
        ref = await reference(client, fleet, path, body)

        async def break_it(s: Streamed) -> None:
            await set_fault(client, fleet, s.headers["x-fleet-backend"], **{fault: 12})

        got = await stream(client, url, path, body, after=6, action=break_it)
        assert got.status == 200 and not got.errors, got.raw[-500:]
        assert got.done == 1
        assert got.text == ref.text
        assert got.usage == ref.usage and got.usage is not None
        assert got.usage["completion_tokens"] == TOKENS
        # The client asked for no token ids: none leak from the proxy's tracking.
        assert b"token_ids" not in got.raw and b"prompt_text" not in got.raw
        # One id, one object kind, one role delta for the whole answer.
        assert len({e["id"] for e in got.events}) == 1
        if path == "/v1/chat/completions":
            roles = [e for e in got.events if e["choices"] and "role" in e["choices"][0]["delta"]]
            assert len(roles) == 1
            assert {e["object"] for e in got.events} == {"chat.completion.chunk"}
        else:
            assert {e["object"] for e in got.events} == {"text_completion"}
        assert (await migrations(client, url)).get(("backend_failed", "ok")) == 1.0


@pytest.mark.parametrize("path", PATHS)
async def test_token_ids_the_client_asked_for_continue_exactly(fleet: SimFleet, path: str) -> None:
    settings = fast_settings(backends(fleet)[:2], policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        body = body_for(path, return_token_ids=True, stream_options={"include_usage": True})
        ref = await reference(client, fleet, path, body)

        async def break_it(s: Streamed) -> None:
            await set_fault(client, fleet, s.headers["x-fleet-backend"], cut_stream_after_tokens=9)

        got = await stream(client, url, path, body, after=4, action=break_it)
        assert not got.errors and got.done == 1
        assert got.token_ids == ref.token_ids and len(got.token_ids) == TOKENS
        assert got.text == ref.text
        assert got.usage == ref.usage


async def test_a_stalled_backend_is_left_after_stall_timeout(fleet: SimFleet) -> None:
    settings = fast_settings(
        backends(fleet)[:2], policy="round_robin", stall_timeout=0.5, read_timeout=120
    )
    path = "/v1/chat/completions"
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=60) as client:
        body = body_for(path)
        ref = await reference(client, fleet, path, body)
        hung: list[str] = []

        async def hang_it(s: Streamed) -> None:
            hung.append(s.headers["x-fleet-backend"])
            await set_fault(client, fleet, hung[0], hang=True)

        try:
            got = await stream(client, url, path, body, after=5, action=hang_it)
            assert not got.errors and got.done == 1
            assert got.text == ref.text
            moved = await migrations(client, url)
            assert moved.get(("backend_stalled", "ok")) == 1.0
            # The client waited about stall_timeout, far from read_timeout: the downtime
            # histogram's sum says how long.
            text = (await client.get(url + "/metrics")).text
            downtime = next(
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("fleet_proxy_migration_downtime_seconds_sum")
            )
            assert 0.5 <= downtime < 60
        finally:
            if hung:
                await set_fault(client, fleet, hung[0], hang=False)


@pytest.mark.parametrize("path", PATHS)
async def test_a_non_streamed_request_moves_and_is_answered_whole(
    fleet: SimFleet, path: str
) -> None:
    settings = fast_settings(backends(fleet)[:2], policy="round_robin", assemble_non_streamed=True)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        plain = {k: v for k, v in body_for(path).items() if k != "stream"}
        ref = (await client.post(fleet.urls[2] + path, json=plain)).json()
        await set_fault(client, fleet, "e0", cut_stream_after_tokens=10)
        answers = [await client.post(url + path, json=plain) for _ in range(2)]
        for r in answers:
            assert r.status_code == 200, r.text
            got = r.json()
            assert got["choices"][0].get("text") == ref["choices"][0].get("text")
            assert got["choices"][0].get("message") == ref["choices"][0].get("message")
            assert got["usage"] == ref["usage"]
            assert got["object"] == ref["object"]
            assert set(got) == set(ref)
        # Round-robin sent one or both (e0 is back after its next health check) to the faulty
        # engine; every one of those moved to the other, which finished it.
        assert [r.headers["x-fleet-backend"] for r in answers] == ["e1", "e1"]
        assert (await migrations(client, url)).get(("backend_failed", "ok")) in (1.0, 2.0)


async def test_by_default_a_non_streamed_request_is_retried_whole(fleet: SimFleet) -> None:
    """Not assembled by default: it cannot move, and a backend dying under it means the
    request is sent again from the start (nothing had reached the client)."""
    settings = fast_settings(backends(fleet)[:2], policy="round_robin")
    path = "/v1/completions"
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(timeout=30) as client:
        plain = {k: v for k, v in body_for(path).items() if k != "stream"}
        ref = (await client.post(fleet.urls[2] + path, json=plain)).json()
        await set_fault(client, fleet, "e0", die_after_tokens=10)
        pending = asyncio.ensure_future(client.post(url + path, json=plain))
        await eventually(lambda: len(app.core.live) == 1)
        [row] = [r.view() for r in app.core.live]
        assert row["movable"] is False and row["not_movable_reason"] == "not_streamed"
        answers = [await pending, await client.post(url + path, json=plain)]
        for r in answers:
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == ref["choices"][0]["text"]
        assert (await migrations(client, url)) == {}
        metrics = (await client.get(url + "/metrics")).text
        assert 'fleet_proxy_requests_not_movable_total{reason="not_streamed"} 2.0' in metrics


@pytest.mark.parametrize("path", PATHS)
async def test_a_planned_move_through_the_admin_api(fleet: SimFleet, path: str) -> None:
    settings = fast_settings(backends(fleet)[:2], policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        body = body_for(path, stream_options={"include_usage": True})
        ref = await reference(client, fleet, path, body)
        results: list[dict[str, Any]] = []

        async def move_it(s: Streamed) -> None:
            rid = s.headers["x-request-id"]
            listed = (await client.get(url + "/admin/requests")).json()
            row = next(r for r in listed if r["request_id"] == rid)
            assert row["movable"] and row["tokens_generated"] >= 5 and row["moves"] == 0
            r = await client.post(url + f"/admin/requests/{rid}/migrate", json={})
            assert r.status_code == 200, r.text
            results.append(r.json())
            source = engine_of(fleet, s.headers["x-fleet-backend"])
            await eventually(lambda: not source.engine.core.running, within=5)

        got = await stream(client, url, path, body, after=6, action=move_it)
        assert not got.errors and got.done == 1
        assert got.text == ref.text and got.usage == ref.usage
        [result] = results
        assert result["outcome"] == "ok"
        assert result["source"] == got.headers["x-fleet-backend"]
        assert result["target"] not in (None, result["source"])
        assert result["tokens"] >= 5 and result["downtime_s"] >= 0
        assert (await migrations(client, url)).get(("admin", "ok")) == 1.0


async def test_evacuate_moves_every_stream_off_a_backend(fleet: SimFleet) -> None:
    settings = fast_settings(backends(fleet)[:2], policy="round_robin")
    path = "/v1/completions"
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(timeout=30) as client:
        body = body_for(path, max_tokens=400)
        ref = await reference(client, fleet, path, {**body})
        started = asyncio.Event()
        count = 6

        async def one() -> Streamed:
            async def mark(_: Streamed) -> None:
                if sum(1 for r in app.core.live if r.view()["tokens_generated"]) >= count:
                    started.set()
                await started.wait()

            return await stream(client, url, path, body, after=3, action=mark)

        tasks = [asyncio.create_task(one()) for _ in range(count)]
        await asyncio.wait_for(started.wait(), timeout=20)
        on_e0 = len(app.core.live.on_backend("e0"))
        assert on_e0 > 0
        r = await client.post(url + "/admin/backends/e0/evacuate")
        assert r.status_code == 200, r.text
        report = r.json()
        assert report["requests"] == on_e0 and report["outcomes"] == {"ok": on_e0}
        assert report["draining"] is True
        await eventually(lambda: not fleet.engines[0].engine.core.running, within=5)
        assert not app.core.live.on_backend("e0")
        for got in await asyncio.gather(*tasks):
            assert not got.errors and got.done == 1
            assert got.text == ref.text


async def test_a_request_that_cannot_move_ends_with_an_error_event(fleet: SimFleet) -> None:
    settings = fast_settings(backends(fleet)[:2], policy="round_robin")
    path = "/v1/completions"
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        body = body_for(path, stop=["never appears"])

        async def break_it(s: Streamed) -> None:
            rid = s.headers["x-request-id"]
            row = next(
                r
                for r in (await client.get(url + "/admin/requests")).json()
                if r["request_id"] == rid
            )
            assert row["movable"] is False and row["not_movable_reason"] == "stop_strings"
            r = await client.post(url + f"/admin/requests/{rid}/migrate", json={})
            assert r.status_code == 409 and r.json()["detail"] == "stop_strings"
            await set_fault(client, fleet, s.headers["x-fleet-backend"], cut_stream_after_tokens=8)

        got = await stream(client, url, path, body, after=4, action=break_it)
        assert len(got.errors) == 1 and got.done == 0
        metrics = (await client.get(url + "/metrics")).text
        assert 'fleet_proxy_requests_not_movable_total{reason="stop_strings"} 1.0' in metrics


@pytest.mark.slow
async def test_200_streams_survive_an_engine_killed_mid_run() -> None:
    async with await start_fleet(3, speed=4.0) as f:
        settings = fast_settings(backends(f), policy="least_requests")
        path = "/v1/chat/completions"
        async with (
            running_proxy(settings) as (url, app),
            httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=300)) as client,
        ):
            body = body_for(path, max_tokens=40)
            ref = await stream(client, f.urls[0], path, body)
            streams = [asyncio.create_task(stream(client, url, path, body)) for _ in range(200)]
            await eventually(lambda: len(app.core.live.on_backend("e1")) >= 20, within=30)
            await f.engines[1].crash()
            results = await asyncio.gather(*streams)
            assert all(r.status == 200 for r in results)
            assert [r for r in results if r.errors or r.done != 1] == []
            assert all(r.text == ref.text for r in results)


async def test_a_seeded_request_moves_on_failure_only(fleet: SimFleet) -> None:
    settings = fast_settings(backends(fleet)[:2], policy="round_robin")
    path = "/v1/completions"
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        body = body_for(path, seed=7)
        ref = await reference(client, fleet, path, body)
        refused: list[httpx.Response] = []

        async def move_then_break(s: Streamed) -> None:
            rid = s.headers["x-request-id"]
            refused.append(await client.post(url + f"/admin/requests/{rid}/migrate", json={}))
            await set_fault(client, fleet, s.headers["x-fleet-backend"], cut_stream_after_tokens=9)

        got = await stream(client, url, path, body, after=4, action=move_then_break)
        [r] = refused
        assert r.status_code == 409 and r.json() == {
            "request_id": got.headers["x-request-id"],
            "outcome": "not_movable",
            "detail": "seed",
        }
        assert not got.errors and got.done == 1 and got.text == ref.text
        assert (await migrations(client, url)).get(("backend_failed", "ok")) == 1.0


async def test_migrate_to_a_named_backend_and_its_errors(fleet: SimFleet) -> None:
    settings = fast_settings(backends(fleet), policy="round_robin", admin_token="s3cret")
    path = "/v1/chat/completions"
    auth = {"x-admin-token": "s3cret"}
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        body = body_for(path)
        ref = await reference(client, fleet, path, body)
        answers: dict[str, httpx.Response] = {}

        async def move_it(s: Streamed) -> None:
            rid, source = s.headers["x-request-id"], s.headers["x-fleet-backend"]
            target = next(b for b in ("e0", "e1", "e2") if b != source)
            migrate = url + f"/admin/requests/{rid}/migrate"
            answers["no token"] = await client.post(migrate, json={"to": target})
            answers["unknown backend"] = await client.post(migrate, json={"to": "e9"}, headers=auth)
            answers["bad reason"] = await client.post(
                migrate, json={"reason": "Not A Label"}, headers=auth
            )
            answers["unknown request"] = await client.post(
                url + "/admin/requests/nope/migrate", json={}, headers=auth
            )
            answers["same backend"] = await client.post(migrate, json={"to": source}, headers=auth)
            answers["ok"] = await client.post(
                migrate, json={"to": target, "reason": "rebalance"}, headers=auth
            )

        got = await stream(client, url, path, body, after=5, action=move_it)
        assert answers["no token"].status_code == 401
        assert answers["unknown backend"].status_code == 404
        assert answers["bad reason"].status_code == 400
        assert answers["unknown request"].status_code == 404
        assert answers["same backend"].status_code == 409
        assert answers["same backend"].json()["detail"] == "already_there"
        ok = answers["ok"].json()
        assert answers["ok"].status_code == 200 and ok["outcome"] == "ok"
        assert ok["target"] == next(b for b in ("e0", "e1", "e2") if b != ok["source"])
        assert not got.errors and got.done == 1 and got.text == ref.text
        moved = await client.get(url + "/metrics")
        assert 'fleet_proxy_migrations_total{outcome="ok",reason="rebalance"} 1.0' in moved.text


async def test_a_move_whose_target_fails_returns_to_its_source_and_says_so(
    fleet: SimFleet, caplog: pytest.LogCaptureFixture
) -> None:
    """The named target answers the continuation with a 500: the client's stream goes on, on
    its source, token-exact, and the admin API and the log report the move as returned, not
    as a move from the source to itself."""
    caplog.set_level(logging.INFO, logger="fleet_proxy.moves")
    settings = fast_settings(backends(fleet), policy="round_robin")
    path = "/v1/chat/completions"
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        body = body_for(path)
        ref = await reference(client, fleet, path, body)
        answers: dict[str, httpx.Response] = {}

        async def move_it(s: Streamed) -> None:
            rid, source = s.headers["x-request-id"], s.headers["x-fleet-backend"]
            target = next(b for b in ("e0", "e1") if b != source)
            await set_fault(client, fleet, target, error_rate=1.0)
            migrate = url + f"/admin/requests/{rid}/migrate"
            answers["move"] = await client.post(migrate, json={"to": target})

        got = await stream(client, url, path, body, after=5, action=move_it)
        source = got.headers["x-fleet-backend"]
        answer = answers["move"].json()
        assert answers["move"].status_code == 409, answer
        assert answer["outcome"] == "returned"
        assert answer["source"] == source and answer["target"] == source
        assert "HTTP 500" in answer["detail"] and "continued on its source" in answer["detail"]
        assert not got.errors and got.done == 1 and got.text == ref.text
        assert got.token_ids == ref.token_ids
        assert (await migrations(client, url)) == {("admin", "failed"): 1.0}
        lines = [r.getMessage() for r in caplog.records if r.name == "fleet_proxy.moves"]
        assert not any(f"moved {source} -> {source}" in line for line in lines), lines
        said = [line for line in lines if f"not moved off {source}" in line]
        assert len(said) == 1 and "HTTP 500" in said[0], lines


async def test_a_planned_move_with_nowhere_to_go_leaves_the_request_running(
    fleet: SimFleet,
) -> None:
    """Evacuating the only routable backend, or moving to a draining one, is refused up front:
    the request keeps streaming where it is, nothing lost, and the backend is not drained."""
    settings = fast_settings(backends(fleet)[:2], policy="round_robin")
    path = "/v1/completions"
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        body = body_for(path)
        ref = await reference(client, fleet, path, body)
        answers: dict[str, httpx.Response] = {}

        async def try_moves(s: Streamed) -> None:
            rid, source = s.headers["x-request-id"], s.headers["x-fleet-backend"]
            other = "e1" if source == "e0" else "e0"
            await client.post(url + f"/admin/backends/{other}/drain")
            migrate = url + f"/admin/requests/{rid}/migrate"
            answers["to draining"] = await client.post(migrate, json={"to": other})
            answers["evacuate"] = await client.post(url + f"/admin/backends/{source}/evacuate")

        got = await stream(client, url, path, body, after=4, action=try_moves)
        assert answers["to draining"].status_code == 409
        assert answers["to draining"].json()["detail"] == "target_unavailable"
        assert answers["evacuate"].status_code == 409
        assert "no other routable backend" in answers["evacuate"].json()["error"]["message"]
        source = got.headers["x-fleet-backend"]
        views = (await client.get(url + "/admin/backends")).json()
        assert [b["id"] for b in views if b["draining"]] == ["e1" if source == "e0" else "e0"]
        assert not got.errors and got.done == 1 and got.text == ref.text
        assert (await migrations(client, url)) == {}


@pytest.mark.parametrize("kind", ["non_streamed", "stream_not_movable"])
async def test_requests_on_a_backend_found_down_leave_it_at_once(
    fleet: SimFleet, kind: str
) -> None:
    """A hung engine fails its health checks; the requests it holds that sent nothing to their
    clients are sent again elsewhere then, not after read_timeout (60 s here, longer than the
    client waits)."""
    settings = fast_settings(
        backends(fleet)[:2], policy="round_robin", read_timeout=60, scrape_timeout=0.2
    )
    path = "/v1/completions"
    plain = {k: v for k, v in body_for(path).items() if k != "stream"}
    body = plain if kind == "non_streamed" else {**plain, "stream": True, "stop": ["zzz"]}
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        await set_fault(client, fleet, "e0", hang=True)
        try:
            # Round-robin: one of the two lands on the hung engine and waits there.
            tasks = [asyncio.ensure_future(client.post(url + path, json=body)) for _ in range(2)]
            answers = await asyncio.gather(*tasks)
        finally:
            await set_fault(client, fleet, "e0", hang=False)
    for r in answers:
        assert r.status_code == 200, r.text
        if kind == "non_streamed":
            assert r.json()["usage"]["completion_tokens"] == TOKENS
        else:
            assert r.text.count("data: [DONE]") == 1 and '"error"' not in r.text
