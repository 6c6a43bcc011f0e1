"""The planner inside `fleet-proxy serve` (`planner_enabled`): a real proxy on a real port, a
simulated engine, and the planner adding a `fleet-proxy sim` worker through the proxy's own
registry; its status at GET /admin/planner, its metrics at /metrics, its TensorBoard files,
and its task ended on shutdown while its worker stays up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from simulator.fleet import start_fleet
from tests.support.polling import eventually
from tests.support.processes import alive
from tests.support.servers import fast_settings, running_proxy
from tests.support.tb_events import scalars, texts

MODEL = "sim-llama-8b"


def planner_task() -> asyncio.Task[Any]:
    return next(t for t in asyncio.all_tasks() if t.get_name() == "planner")


async def test_admin_planner_when_disabled() -> None:
    async with (
        running_proxy(fast_settings([]), wait_ready=False) as (url, _),
        httpx.AsyncClient() as client,
    ):
        r = await client.get(url + "/admin/planner")
    assert r.status_code == 200
    assert r.json() == {"enabled": False, "decisions": [], "drains": []}


async def test_admin_planner_when_enabled(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("metric_pulling_interval: 0.1\nadjustment_interval: 60\n")
    settings = fast_settings(
        [], planner_enabled=True, planner_config=plan, planner_state_file=tmp_path / "s.json"
    )
    async with (
        running_proxy(settings, wait_ready=False) as (url, _),
        httpx.AsyncClient() as client,
    ):
        task = planner_task()

        async def sampled() -> bool:
            return (await client.get(url + "/admin/planner")).json()["last_sample"] is not None

        await eventually(sampled, 10, "a metric pull", every=0.1)
        status = (await client.get(url + "/admin/planner")).json()
    assert status["enabled"] is True
    assert status["config"]["adjustment_interval"] == 60.0
    assert status["state"]["decode_replicas"] == 0 and status["decisions"] == []
    assert status["last_sample"]["decode_kv"] is None  # no worker: no value, not 0
    assert task.done()  # ended with the proxy


async def stream(client: httpx.AsyncClient, url: str) -> str:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 150,
            "ignore_eos": True, "stream": True}  # fmt: skip
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for _ in r.aiter_bytes():
            pass
        return r.headers.get("x-fleet-backend", "")


@pytest.mark.slow
async def test_colocated_planner_scales_up_through_the_proxy(tmp_path: Path) -> None:
    # Any KV in use is over the up threshold, none is under the down one, and at most two
    # workers: the first due decision adds one worker, and no later one removes it.
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "topology: aggregated\nmetric_pulling_interval: 0.25\nadjustment_interval: 1.5\n"
        "decode_kv_scale_up_threshold: 0.0001\ndecode_kv_scale_down_threshold: 0.0\n"
        "max_decode_replicas: 2\nnew_decode_worker_grace_period: 0\n"
    )
    state_file = tmp_path / "state.json"
    worker_pid: int | None = None
    async with await start_fleet(1, speed=1.0) as fleet:
        settings = fast_settings(
            [fleet.urls[0]],
            policy="round_robin",
            planner_enabled=True,
            planner_config=plan,
            planner_state_file=state_file,
            planner_worker_log_dir=tmp_path / "workers",
            planner_log_dir=tmp_path / "tb",
            planner_start_timeout=60.0,
        )
        try:
            async with (
                running_proxy(settings) as (url, app),
                httpx.AsyncClient(timeout=60) as client,
            ):
                task = planner_task()
                stop = asyncio.Event()
                served_by: list[str] = []

                async def streamer() -> None:
                    while not stop.is_set():
                        served_by.append(await stream(client, url))

                streams = [asyncio.create_task(streamer()) for _ in range(3)]
                try:

                    async def added() -> bool:
                        status = (await client.get(url + "/admin/planner")).json()
                        return status["state"]["decode_replicas"] == 2

                    await eventually(added, 60, "the planner added a worker", every=0.1)
                    workers = json.loads(state_file.read_text())["workers"]
                    assert len(workers) == 1
                    worker_id, worker_pid = workers[0]["id"], workers[0]["pid"]
                    assert worker_id.startswith("planner-decode-")

                    async def serving() -> bool:
                        return worker_id in served_by

                    await eventually(serving, 30, "a request answered by the new worker", every=0.1)
                finally:
                    stop.set()
                    await asyncio.gather(*streams)
                backends = (await client.get(url + "/admin/backends")).json()
                new = next(b for b in backends if b["id"] == worker_id)
                assert new["role"] == "both" and new["routable"] and not new["draining"]
                status = (await client.get(url + "/admin/planner")).json()
                first = status["decisions"][0]
                assert first["errors"] == []
                assert first["decision"]["roles"][0]["reason"] == "scale_up_kv"
                assert first["decision"]["roles"][0]["desired"] == 2
                assert "scale_down_kv" not in {
                    d["decision"]["roles"][0]["reason"] for d in status["decisions"]
                }
                metrics = (await client.get(url + "/metrics")).text
                assert (
                    'fleet_proxy_planner_decisions_total{reason="scale_up_kv",role="decode"} 1.0'
                    in metrics
                )
                assert 'fleet_proxy_planner_replicas{role="decode"} 2.0' in metrics
                assert app.core.fleet.get(worker_id) is not None
            # The proxy has shut down: the planner's task with it, its worker still up.
            assert task.done()
            os.kill(worker_pid, 0)
            # The TensorBoard files were closed with the planner: its first decision is in.
            assert scalars(tmp_path / "tb")["decode/replicas"][0] == (1, 2.0)
            assert texts(tmp_path / "tb")["decode/reason"][0] == "scale_up_kv"
        finally:
            if worker_pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker_pid, signal.SIGKILL)
                # Best effort, in a cleanup: a worker still there must not hide the failure.
                with contextlib.suppress(AssertionError):
                    pid = worker_pid
                    await eventually(lambda: not alive(pid), 5, "the worker gone", every=0.05)
