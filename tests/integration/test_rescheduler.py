"""The rescheduler end to end on simulated engines and real sockets: it moves streams off a
drained backend (never into its failure domain), rebalances a skewed fleet, runs standalone
against a running proxy, and with two workers moves no request twice. Every stream still
completes whole."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from simulator.fleet import SimFleet, start_fleet
from tests.integration.test_movable_requests import Streamed, body_for, stream
from tests.integration.test_workers import serve
from tests.support.polling import eventually
from tests.support.processes import free_port
from tests.support.servers import fast_settings, running_proxy

REPO = Path(__file__).resolve().parents[2]
PATH = "/v1/completions"
pytestmark = pytest.mark.slow


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(3, speed=1.0) as f:
        yield f


def backends(f: SimFleet, nodes: list[str]) -> list[dict[str, str]]:
    return [
        {"url": u, "id": f"e{i}", "node": n}
        for i, (u, n) in enumerate(zip(f.urls, nodes, strict=False))
    ]


def running_on(f: SimFleet, i: int) -> int:
    return len(f.engines[i].engine.core.running)


async def reference(client: httpx.AsyncClient, f: SimFleet, body: dict[str, Any]) -> str:
    ref = await stream(client, f.urls[2], PATH, body)
    assert ref.status == 200 and ref.done == 1 and not ref.errors
    return ref.text


async def start_streams(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    count: int,
    headers: dict[str, str] | None = None,
) -> tuple[list[asyncio.Task[Streamed]], asyncio.Event]:
    """`count` streams; the event is set once each has received some tokens."""
    seen: set[int] = set()
    started = asyncio.Event()

    async def one(i: int) -> Streamed:
        async def mark(_: Streamed) -> None:
            seen.add(i)
            if len(seen) == count:
                started.set()

        return await stream(client, url, PATH, body, after=3, action=mark, headers=headers)

    return [asyncio.create_task(one(i)) for i in range(count)], started


def all_whole(results: list[Streamed], text: str) -> None:
    for got in results:
        assert got.status == 200 and not got.errors and got.done == 1
        assert got.text == text


async def migrations_metric(client: httpx.AsyncClient, url: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in (await client.get(url + "/metrics")).text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].split("} ")
            out[labels] = float(value)
    return out


async def test_a_drained_backends_streams_fail_over_outside_its_node(fleet: SimFleet) -> None:
    settings = fast_settings(
        backends(fleet, ["n1", "n1", "n2"]),
        policy="round_robin",
        enable_rescheduling=True,
        rescheduling_interval_ms=100,
        rescheduling_policies="neutral_failover",
        failover_domain="node",
    )
    body = body_for(PATH, max_tokens=400)
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(timeout=60) as client:
        text = await reference(client, fleet, body)
        # Every stream on e0 first: the other two take nothing new while drained.
        for b in ("e1", "e2"):
            assert (await client.post(f"{url}/admin/backends/{b}/drain")).status_code == 200
        tasks, started = await start_streams(client, url, body, 4)
        await asyncio.wait_for(started.wait(), timeout=30)
        assert len(app.core.live.on_backend("e0")) == 4
        for b in ("e1", "e2"):
            assert (await client.post(f"{url}/admin/backends/{b}/undrain")).status_code == 200
        assert (await client.post(f"{url}/admin/backends/e0/drain")).status_code == 200
        await eventually(lambda: not app.core.live.on_backend("e0"), within=15)
        # e1 shares e0's node: none of them went there.
        assert len(app.core.live.on_backend("e2")) == 4 and not app.core.live.on_backend("e1")
        all_whole(list(await asyncio.gather(*tasks)), text)
        assert running_on(fleet, 1) == 0
        state = (await client.get(url + "/admin/rescheduler")).json()
        assert state["enabled"] is True and state["config"]["failover_domain"] == "node"
        moved = [p for c in state["migrating_cycles"] for p in c["pairs"]]
        assert moved
        assert all(p["policy"] == "neutral_failover" and p["target"] == "e2" for p in moved)
        counts = await migrations_metric(client, url, "fleet_proxy_rescheduling_migrations_total")
        assert counts.get('outcome="ok",policy="neutral_failover"') == 4.0
        proxy_counts = await migrations_metric(client, url, "fleet_proxy_migrations_total")
        assert proxy_counts.get('outcome="ok",reason="neutral_failover"') == 4.0


async def test_a_skewed_fleet_is_rebalanced_by_neutral_load(fleet: SimFleet) -> None:
    settings = fast_settings(
        backends(fleet, ["n1", "n2"]),
        policy="round_robin",
        enable_rescheduling=True,
        rescheduling_interval_ms=100,
        rescheduling_policies="neutral_load",
        rescheduling_neutral_load_metric="num_requests",
        rescheduling_neutral_load_threshold=3,
        rescheduling_req_select_rule="NUM_REQ",
        rescheduling_req_select_value=1,
    )
    body = body_for(PATH, max_tokens=400)
    async with running_proxy(settings) as (url, _app), httpx.AsyncClient(timeout=60) as client:
        text = await reference(client, fleet, body)
        assert (await client.post(f"{url}/admin/backends/e1/drain")).status_code == 200
        tasks, started = await start_streams(client, url, body, 6)
        await asyncio.wait_for(started.wait(), timeout=30)
        assert running_on(fleet, 0) == 6 and running_on(fleet, 1) == 0
        assert (await client.post(f"{url}/admin/backends/e1/undrain")).status_code == 200
        # Seen by the engines themselves: e1 took requests, e0 gave them.
        await eventually(lambda: running_on(fleet, 1) >= 3, within=15)
        assert running_on(fleet, 0) <= 3
        all_whole(list(await asyncio.gather(*tasks)), text)


async def test_a_stale_backends_streams_fail_over(fleet: SimFleet) -> None:
    """An engine whose /metrics stops answering still serves, but its numbers go stale:
    after `instance_staleness_seconds` its streams move, though its health check passes."""
    settings = fast_settings(
        backends(fleet, ["n1", "n2"]),
        policy="round_robin",
        enable_rescheduling=True,
        rescheduling_interval_ms=100,
        rescheduling_policies="neutral_failover",
        instance_staleness_seconds=1.0,
    )
    body = body_for(PATH, max_tokens=1500)
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(timeout=60) as client:
        text = await reference(client, fleet, body)
        assert (await client.post(f"{url}/admin/backends/e1/drain")).status_code == 200
        tasks, started = await start_streams(client, url, body, 3)
        await asyncio.wait_for(started.wait(), timeout=30)
        assert (await client.post(f"{url}/admin/backends/e1/undrain")).status_code == 200
        fault = await client.post(
            f"{fleet.urls[0]}/_sim/faults", json={"metrics_unavailable": True}
        )
        assert fault.status_code == 200
        await eventually(lambda: not app.core.live.on_backend("e0"), within=20)
        assert len(app.core.live.on_backend("e1")) == 3
        assert app.core.fleet.get("e0").healthy  # it was its staleness that moved them
        all_whole(list(await asyncio.gather(*tasks)), text)
        counts = await migrations_metric(client, url, "fleet_proxy_rescheduling_migrations_total")
        assert counts.get('outcome="ok",policy="neutral_failover"') == 3.0


async def test_consolidation_empties_the_less_loaded_engine(fleet: SimFleet) -> None:
    """Two engines decoding far under the TPOT target: binpacking_consolidation moves the
    lighter one's requests to the other, which stays under the dispatch threshold, and the
    lighter engine (by its own count) runs nothing."""
    settings = fast_settings(
        backends(fleet, ["n1", "n2"]),
        policy="round_robin",
        enable_rescheduling=True,
        rescheduling_interval_ms=100,
        rescheduling_policies="binpacking_consolidation",
        tpot_slo=500,  # floor 300 ms, dispatch 425 ms: far over a simulated H100's ITL
    )
    body = body_for(PATH, max_tokens=1500)
    async with running_proxy(settings) as (url, _app), httpx.AsyncClient(timeout=60) as client:
        text = await reference(client, fleet, body)
        # One stream on e0, three on e1.
        assert (await client.post(f"{url}/admin/backends/e1/drain")).status_code == 200
        one, started_one = await start_streams(client, url, body, 1)
        await asyncio.wait_for(started_one.wait(), timeout=30)
        assert (await client.post(f"{url}/admin/backends/e1/undrain")).status_code == 200
        assert (await client.post(f"{url}/admin/backends/e0/drain")).status_code == 200
        three, started_three = await start_streams(client, url, body, 3)
        await asyncio.wait_for(started_three.wait(), timeout=30)
        assert (await client.post(f"{url}/admin/backends/e0/undrain")).status_code == 200
        # Consolidated: one engine runs all four, the other none.
        await eventually(
            lambda: sorted((running_on(fleet, 0), running_on(fleet, 1))) == [0, 4], within=20
        )
        all_whole(list(await asyncio.gather(*one, *three)), text)
        state = (await client.get(url + "/admin/rescheduler")).json()
        pairs = [p for c in state["migrating_cycles"] for p in c["pairs"]]
        assert pairs and all(p["policy"] == "binpacking_consolidation" for p in pairs)
        counts = await migrations_metric(client, url, "fleet_proxy_rescheduling_migrations_total")
        assert counts.get('outcome="ok",policy="binpacking_consolidation"', 0) >= 1


async def rescheduler_cycles(client: httpx.AsyncClient, metrics_url: str) -> float:
    """Cycles the standalone rescheduler has run (each one read the proxy's view); 0 while
    its metrics do not answer yet."""
    try:
        text = (await client.get(metrics_url)).text
    except httpx.TransportError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("fleet_proxy_rescheduling_cycles_total "):
            return float(line.split()[1])
    return 0.0


@contextlib.asynccontextmanager
async def standalone_rescheduler(
    client: httpx.AsyncClient, url: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`reschedule --proxy URL` as a child process, yielded once it has run a cycle against
    the proxy: a loaded machine takes seconds to start it, and what it should move must not
    have finished by then."""
    metrics_port = free_port()
    cmd = [sys.executable, "-m", "proxy.serving.cli", "reschedule", "--proxy", url,
           "--rescheduling-interval-ms", "100", "--rescheduling-policies", "neutral_failover",
           "--metrics-port", str(metrics_port), "--log-level", "warning"]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=REPO, env=dict(os.environ))
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    async def cycled() -> bool:
        assert proc.returncode is None, f"the rescheduler exited with {proc.returncode}"
        return await rescheduler_cycles(client, metrics_url) >= 1

    try:
        await eventually(cycled, within=60, what="a first rescheduling cycle", every=0.1)
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_standalone_reschedule_moves_a_running_proxys_requests(fleet: SimFleet) -> None:
    settings = fast_settings(backends(fleet, ["n1", "n2"]), policy="round_robin")
    # Twice the others' length: the streams must still run when e0 is drained, however slow
    # the machine.
    body = body_for(PATH, max_tokens=800)
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(timeout=60) as client:
        text = await reference(client, fleet, body)
        view = (await client.get(url + "/admin/rescheduler/view")).json()
        assert [i["id"] for i in view["instances"]] == ["e0", "e1"]
        assert (await client.get(url + "/admin/rescheduler")).json()["enabled"] is False
        # Up and cycling before any stream starts: nothing is drained, so it moves nothing.
        async with standalone_rescheduler(client, url):
            assert (await client.post(f"{url}/admin/backends/e1/drain")).status_code == 200
            tasks, started = await start_streams(client, url, body, 3)
            await asyncio.wait_for(started.wait(), timeout=30)
            assert len(app.core.live.on_backend("e0")) == 3
            assert (await client.post(f"{url}/admin/backends/e1/undrain")).status_code == 200
            assert (await client.post(f"{url}/admin/backends/e0/drain")).status_code == 200
            await eventually(
                lambda: not app.core.live.on_backend("e0"), within=20, what="e0 emptied"
            )
            assert len(app.core.live.on_backend("e1")) == 3
            all_whole(list(await asyncio.gather(*tasks)), text)
            counts = await migrations_metric(client, url, "fleet_proxy_migrations_total")
            assert counts.get('outcome="ok",reason="neutral_failover"') == 3.0


def legs_of(got: Streamed) -> list[dict[str, Any]]:
    for block in got.raw.split(b"\n\n"):
        if block.startswith(b": x-fleet-legs "):
            legs: list[dict[str, Any]] = orjson.loads(block[len(b": x-fleet-legs ") :])
            return legs
    raise AssertionError("no legs receipt")


async def test_with_two_workers_no_request_is_moved_twice(
    fleet: SimFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in {
        "ENABLE_RESCHEDULING": "true",
        "RESCHEDULING_INTERVAL_MS": "100",
        "RESCHEDULING_POLICIES": "neutral_failover",
        "DEBUG_RECEIPTS": "true",
        "POLICY": "round_robin",
    }.items():
        monkeypatch.setenv("FLEET_PROXY_" + k, v)
    body = body_for(PATH, max_tokens=400)
    async with serve(fleet.urls[:2]) as served, httpx.AsyncClient(timeout=60) as client:
        text = await reference(client, fleet, body)
        # Separate connections: both workers get some of the streams.
        clients = [httpx.AsyncClient(timeout=60) for _ in range(6)]
        try:
            ids = (await client.get(served.url + "/admin/backends")).json()
            e0, e1 = (b["id"] for b in ids)
            assert (await client.post(f"{served.url}/admin/backends/{e1}/drain")).status_code == 200

            async def routable_everywhere(n: int) -> bool:
                rows = (await served.workers(client))["rows"]
                return len(rows) == 2 and all(r["routable"] == n for r in rows)

            await eventually(lambda: routable_everywhere(1), within=15)  # both applied it
            started = [
                await start_streams(c, served.url, body, 1, {"x-fleet-debug": "1"}) for c in clients
            ]
            for _, ev in started:
                await asyncio.wait_for(ev.wait(), timeout=30)
            assert running_on(fleet, 0) == 6
            assert (
                await client.post(f"{served.url}/admin/backends/{e1}/undrain")
            ).status_code == 200
            assert (await client.post(f"{served.url}/admin/backends/{e0}/drain")).status_code == 200
            results = [r for tasks, _ in started for r in await asyncio.gather(*tasks)]
        finally:
            for c in clients:
                await c.aclose()
        all_whole(results, text)
        for got in results:
            legs = legs_of(got)
            assert [leg["backend"] for leg in legs] == [e0, e1], legs
