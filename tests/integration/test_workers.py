"""`fleet-proxy serve --workers 2` as a real process tree in front of fake backends on real
sockets: both workers serve, every answer is right, they see each other's load, an admin
drain on one reaches the other, no worker outlives the supervisor, and once stopping the
proxy refuses new connections, on either kind of listening socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from simulator.fleet import start_fleet
from tests.support.fake_backend import Behaviour, FakeBackend
from tests.support.polling import eventually
from tests.support.processes import alive, refused

REPO = Path(__file__).resolve().parents[2]
BANNER = re.compile(rb"base_url = http://127\.0\.0\.1:(\d+)/v1")
EXPECTED_TEXT = "".join(f"t{i} " for i in range(8))  # FakeBackend's answer, 8 chunks


@dataclass
class Served:
    process: asyncio.subprocess.Process
    url: str

    async def workers(self, client: httpx.AsyncClient) -> dict[str, Any]:
        r = await client.get(self.url + "/admin/workers")
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data


@contextlib.asynccontextmanager
async def serve(
    backends: list[str],
    *extra: str,
    listen: str = "reuseport",
    workers: int = 2,
    routable: int | None = None,
    env_extra: dict[str, str] | None = None,
) -> AsyncIterator[Served]:
    """A proxy of `workers` processes on a port of its own choosing (read from its banner),
    every worker routing to every backend (or to `routable` backends, when a --config names
    them) before this yields."""
    cmd = [
        sys.executable,
        "-m",
        "proxy.serving.cli",
        "serve",
        "--workers",
        str(workers),
        "--port",
        "0",
    ]
    cmd += ["--log-level", "warning", *extra]
    for b in backends:
        cmd += ["--backend", b]
    env = {
        **os.environ,
        "FLEET_PROXY_SCRAPE_INTERVAL": "0.05",
        "FLEET_PROXY_HEALTH_INTERVAL": "0.1",
        "FLEET_PROXY_WORKER_LISTEN": listen,
        **(env_extra or {}),
    }
    process = await asyncio.create_subprocess_exec(
        *cmd, cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        match = BANNER.search(line)
        assert match, f"no banner: {line!r}"
        served = Served(process, f"http://127.0.0.1:{int(match.group(1))}")
        async with httpx.AsyncClient(timeout=5) as client:

            async def every_worker_routes() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    rows = (await served.workers(client))["rows"]
                    want = len(backends) if routable is None else routable
                    return all(r["routable"] == want for r in rows)
                return False

            await eventually(every_worker_routes, within=30, what="every worker routes", every=0.05)
        yield served
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=20)
            except TimeoutError:
                process.kill()
                await process.wait()


@pytest.fixture
async def backends() -> AsyncIterator[list[FakeBackend]]:
    fakes = [FakeBackend(), FakeBackend()]
    for f in fakes:
        await f.start()
    yield fakes
    for f in fakes:
        await f.stop()


def backend_id(b: FakeBackend) -> str:
    return b.url.removeprefix("http://")


async def complete(client: httpx.AsyncClient, url: str, i: int) -> httpx.Response:
    body = {"model": "fake-model", "prompt": f"request {i}", "max_tokens": 8}
    if i % 4 == 3:
        body["stream"] = True
    return await client.post(url + "/v1/completions", json=body)


def text_of(r: httpx.Response) -> str:
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    return str(r.json()["choices"][0]["text"])


async def burst(
    url: str, n: int, concurrency: int, *, new_connections: bool
) -> list[httpx.Response]:
    # Without keep-alive every request is a new connection, accepted by whichever worker
    # takes it: the way to reach both workers from one client.
    limits = httpx.Limits(
        max_connections=concurrency, max_keepalive_connections=0 if new_connections else None
    )
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        return await asyncio.gather(*(complete(client, url, i) for i in range(n)))


async def test_two_workers_serve_share_load_and_admin_changes(
    backends: list[FakeBackend],
) -> None:
    ids = {backend_id(b) for b in backends}
    async with serve([b.url for b in backends], "--policy", "round_robin") as served:
        url = served.url
        responses = await burst(url, 240, 32, new_connections=True)
        for r in responses:
            assert r.status_code == 200, r.text
            assert text_of(r) == EXPECTED_TEXT
            assert r.headers["x-fleet-backend"] in ids
            assert r.headers["x-request-id"]
        async with httpx.AsyncClient(timeout=5) as client:
            info = await served.workers(client)
            dispatched = [row["dispatched"] for row in info["rows"]]
            assert info["workers"] == 2
            assert sum(dispatched) == 240
            assert min(dispatched) > 0, f"one worker served nothing: {dispatched}"
            metrics = (await client.get(url + "/metrics")).text
            assert re.search(r'target_info\{.*worker="[01]"', metrics)
            assert "fleet_proxy_backend_peer_in_flight{" in metrics

            # Peers' load: requests held at the backends are counted by every worker, each
            # seeing its own in_flight plus its peer's.
            for b in backends:
                b.behaviour.first_byte_delay = 3.0
            held = asyncio.ensure_future(burst(url, 8, 8, new_connections=True))

            # Each worker's view, asked on new connections until both have answered with all
            # 8 counted: own + peer == 8 in each, however the 8 were split between them.
            views: dict[int, dict[str, dict[str, int]]] = {}

            async def both_see_all_eight() -> bool:
                async with httpx.AsyncClient(timeout=5) as fresh:
                    info = await served.workers(fresh)
                loads = info["backends"].values()
                if sum(ld["in_flight"] + ld["peer_in_flight"] for ld in loads) == 8:
                    views[info["answered_by"]] = info["backends"]
                return len(views) == 2

            await eventually(both_see_all_eight, within=15, what="both see all eight", every=0.05)
            for bid in ids:
                assert views[0][bid]["in_flight"] == views[1][bid]["peer_in_flight"]
                assert views[1][bid]["in_flight"] == views[0][bid]["peer_in_flight"]
            for b in backends:
                b.behaviour.first_byte_delay = 0.0
            assert all(r.status_code == 200 for r in await held)

            # An admin drain answered by one worker reaches the other.
            drained, other = sorted(ids)
            r = await client.post(f"{url}/admin/backends/{drained}/drain")
            assert r.status_code == 200 and r.json()["draining"] is True

            async def both_applied() -> bool:
                rows = (await served.workers(client))["rows"]
                return len({row["changes_applied_to"] for row in rows}) == 1

            await eventually(both_applied, within=15, what="both applied", every=0.05)
            before = [row["dispatched"] for row in (await served.workers(client))["rows"]]
            after_drain = await burst(url, 80, 16, new_connections=True)
            assert all(r.status_code == 200 for r in after_drain)
            assert {r.headers["x-fleet-backend"] for r in after_drain} == {other}
            rows = (await served.workers(client))["rows"]
            served_now = [row["dispatched"] - b for row, b in zip(rows, before, strict=True)]
            assert min(served_now) > 0, f"one worker served nothing after the drain: {served_now}"

        # SIGTERM on the supervisor ends every worker.
        pids = [row["pid"] for row in rows]
        assert all(alive(pid) for pid in pids)
        served.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(served.process.wait(), timeout=20) == 0
        assert not any(alive(pid) for pid in pids)


async def test_a_dying_worker_stops_the_proxy_and_is_named(backends: list[FakeBackend]) -> None:
    # On one shared listening socket this time: it serves as well (how evenly is for
    # scripts/perf/bench_proxy_overhead.py to say).
    async with (
        serve([backends[0].url], listen="shared") as served,
        httpx.AsyncClient(timeout=5) as client,
    ):
        answers = await burst(served.url, 16, 8, new_connections=True)
        assert [text_of(r) for r in answers] == [EXPECTED_TEXT] * 16
        rows = (await served.workers(client))["rows"]
        pids = {row["worker"]: row["pid"] for row in rows}
        os.kill(pids[1], signal.SIGKILL)
        assert await asyncio.wait_for(served.process.wait(), timeout=20) == 1
        assert served.process.stderr is not None
        err = (await served.process.stderr.read()).decode()
        assert f"worker 1 (pid {pids[1]}) was killed by SIGKILL" in err
        assert not alive(pids[0])


async def test_workers_do_not_outlive_a_killed_supervisor(
    backends: list[FakeBackend], tmp_path: Path
) -> None:
    # A store file of the test's own: a killed supervisor leaves its default one behind.
    store = {"FLEET_PROXY_RESPONSES_STORE_PATH": str(tmp_path / "responses.sqlite3")}
    async with (
        serve([backends[0].url], env_extra=store) as served,
        httpx.AsyncClient(timeout=5) as client,
    ):
        pids = [row["pid"] for row in (await served.workers(client))["rows"]]
        served.process.kill()  # SIGKILL: no chance to stop them; the kernel tells them
        await served.process.wait()

        async def all_gone() -> bool:
            return not any(alive(pid) for pid in pids)

        await eventually(all_gone, within=15, what="all gone", every=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("listen", ["reuseport", "shared"])
async def test_a_stopping_proxy_refuses_new_connections_while_a_stream_finishes(
    listen: str,
) -> None:
    # A connection the kernel queued on a socket no stopping worker accepts from would wait
    # out the whole grace period: a load balancer must be refused, and move on, at once.
    backend = FakeBackend(behaviour=Behaviour(chunks=60, chunk_delay=0.1))
    await backend.start()
    try:
        async with (
            serve([backend.url], listen=listen) as served,
            httpx.AsyncClient(timeout=30) as client,
        ):
            body = {"model": "fake-model", "prompt": "x", "max_tokens": 60, "stream": True}
            async with client.stream("POST", served.url + "/v1/completions", json=body) as r:
                lines = r.aiter_lines()
                assert (await anext(lines)).startswith("data: ")
                served.process.send_signal(signal.SIGTERM)

                async def refusing() -> bool:
                    return await refused(int(served.url.rsplit(":", 1)[1]))

                # Within 3 s, while the stream has about 6 s to go.
                await eventually(refusing, within=3, what="refusing", every=0.05)
                rest = [ln for ln in [ln async for ln in lines] if ln.startswith("data: ")]
            assert len(rest) >= 10 and rest[-1] == "data: [DONE]"
            assert await asyncio.wait_for(served.process.wait(), timeout=20) == 0
    finally:
        await backend.stop()


async def test_a_responses_thread_continues_on_either_worker() -> None:
    """The workers share one store file: each turn, on a new connection, may be taken by
    either worker and still finds the turn before it."""

    async with await start_fleet(2, speed=20.0) as fleet, serve(fleet.urls) as served:
        limits = httpx.Limits(max_keepalive_connections=0)  # a new connection per turn
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            previous = None
            for i in range(8):
                body: dict[str, Any] = {
                    "model": "sim-llama-8b",
                    "input": f"Turn {i}",
                    "max_output_tokens": 2,
                }
                if previous is not None:
                    body["previous_response_id"] = previous
                r = await client.post(served.url + "/v1/responses", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["previous_response_id"] == previous
                previous = r.json()["id"]
            assert (await client.get(f"{served.url}/v1/responses/{previous}")).status_code == 200


async def test_idle_workers_keep_their_sync_timers_quiet(backends: list[FakeBackend]) -> None:
    """With nothing to serve, each worker steps its peer sync at the idle beat (5 a second),
    not every 20 ms; a request still finds both workers' rows fresh."""
    async with serve([b.url for b in backends], "--policy", "round_robin") as served:
        async with httpx.AsyncClient(timeout=5) as client:
            before = {r["worker"]: r["sync_steps"] for r in (await served.workers(client))["rows"]}
            await asyncio.sleep(2.0)
            rows = (await served.workers(client))["rows"]
        steps = {r["worker"]: r["sync_steps"] - before[r["worker"]] for r in rows}
        # 2 s at 20 ms would be 100 steps; at the beat about 10, and a loaded machine only
        # delays timers. The worker answering both reads may also step once for each.
        assert all(0 < n <= 20 for n in steps.values()), steps
        responses = await burst(served.url, 8, 4, new_connections=True)
        assert all(r.status_code == 200 and text_of(r) == EXPECTED_TEXT for r in responses)
