"""LoRA adapters across the fleet through the proxy, on three simulated engines that allow
run-time loading: a load reaches every engine serving the base model and /v1/models lists
it, requests for the adapter are served, an unload removes it; with one engine down the
answer shows that engine's failure (207), and the engine gets the adapter once it is back, as
does an engine added later."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from policies.scorers.lora import RUNNING, lora_affinity
from proxy.serving.app import FleetProxyApp
from simulator.fleet import SimFleet, start_fleet
from simulator.lora import LoraConfig
from simulator.server import EngineServer
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
AUTH = {"x-admin-token": "s3cret"}
RUNTIME = LoraConfig(max_loras=2, runtime_updates=True)


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(3, speed=10.0, lora=RUNTIME) as f:
        yield f


def only_live_backend(app: FleetProxyApp) -> str:
    """The backend serving the proxy's only live request."""
    rows = list(app.core.live)
    assert len(rows) == 1
    return rows[0].backend_id


def loaded(engine: EngineServer) -> set[str]:
    return set(engine.engine.adapters.paths)


async def listed(c: httpx.AsyncClient) -> set[str]:
    return {m["id"] for m in (await c.get("/v1/models")).json()["data"]}


async def load(c: httpx.AsyncClient, name: str, **extra: Any) -> httpx.Response:
    body = {"lora_name": name, "lora_path": f"/adapters/{name}", **extra}
    return await c.post("/v1/load_lora_adapter", json=body, headers=AUTH)


async def test_without_an_admin_token_the_routes_are_refused(fleet: SimFleet) -> None:
    settings = fast_settings(fleet.urls)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/a"})
    assert r.status_code == 403
    assert r.json()["error"]["type"] == "permission_error"
    assert "admin_token" in r.json()["error"]["message"]
    assert all(not loaded(e) for e in fleet.engines)


@pytest.mark.slow
async def test_adapters_are_loaded_served_and_unloaded_across_the_fleet(fleet: SimFleet) -> None:
    settings = fast_settings(fleet.urls, admin_token="s3cret")
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        wrong = await c.post(
            "/v1/load_lora_adapter",
            json={"lora_name": "a", "lora_path": "/a"},
            headers={"x-admin-token": "nope"},
        )
        assert wrong.status_code == 401

        r = await load(c, "sql-lora")
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["status"] == "succeeded" and answer["base_model"] == MODEL
        assert sorted(o["id"] for o in answer["backends"]) == sorted(
            e.url.removeprefix("http://") for e in fleet.engines
        )
        assert all(o["ok"] and o["status"] == 200 for o in answer["backends"])
        assert all(loaded(e) == {"sql-lora"} for e in fleet.engines)
        assert "sql-lora" in await listed(c)
        # Loading again asks no engine: each lists it already.
        again = await load(c, "sql-lora")
        assert again.status_code == 200
        assert {o["message"] for o in again.json()["backends"]} == {"already loaded"}

        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        served = set()
        for _ in range(6):
            raw = await client.completions.with_raw_response.create(
                model="sql-lora", prompt="SELECT", max_tokens=2
            )
            assert raw.parse().model == "sql-lora"
            served.add(raw.headers["x-fleet-backend"])
        assert served  # every engine holds it: any may serve it

        # A request for the adapter running on an engine: the LoRA-affinity scorer sees it
        # there from the engine's next metrics scrape.
        stream = await client.completions.create(
            model="sql-lora", prompt="SELECT", max_tokens=3000, stream=True
        )
        assert (await anext(aiter(stream))).model == "sql-lora"
        backend = app.core.fleet.get(only_live_backend(app))
        assert backend is not None

        def running_there() -> bool:
            snapshot = backend.snapshot
            metrics = snapshot.metrics if snapshot is not None else None
            return lora_affinity("sql-lora", metrics) == RUNNING

        await eventually(running_there, within=20, what="the adapter seen running")
        await stream.close()

        r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "sql-lora"}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert all(not loaded(e) for e in fleet.engines)
        assert "sql-lora" not in await listed(c)
        gone = await c.post("/v1/unload_lora_adapter", json={"lora_name": "sql-lora"}, headers=AUTH)
        assert gone.status_code == 404


@pytest.mark.slow
async def test_an_engine_down_fails_its_part_and_gets_the_adapter_when_it_is_back(
    fleet: SimFleet,
) -> None:
    settings = fast_settings(fleet.urls, admin_token="s3cret")
    down = fleet.engines[2]
    down_id = down.url.removeprefix("http://")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        await down.crash()
        r = await load(c, "chat-lora")
        assert r.status_code == 207, r.text
        outcomes = {o["id"]: o for o in r.json()["backends"]}
        assert r.json()["status"] == "partial"
        assert not outcomes[down_id]["ok"] and outcomes[down_id]["status"] is None
        assert "Connect" in outcomes[down_id]["message"]
        assert sum(o["ok"] for o in outcomes.values()) == 2

        await down.recover()  # a restarted engine: no adapters loaded at run time
        await eventually(lambda: loaded(down) == {"chat-lora"}, within=20, what="reloaded")

        async with await start_fleet(1, speed=10.0, lora=RUNTIME) as later:
            new = later.engines[0]
            added = await c.post("/admin/backends", json={"url": new.url}, headers=AUTH)
            assert added.status_code == 201, added.text
            await eventually(lambda: loaded(new) == {"chat-lora"}, within=20, what="loaded")

            async def routed_there() -> bool:
                backends = (await c.get("/admin/backends", headers=AUTH)).json()
                return any(b["url"] == new.url and "chat-lora" in b["models"] for b in backends)

            await eventually(routed_there, within=20, what="the proxy seeing it there")
            await c.delete(f"/admin/backends/{added.json()['id']}", headers=AUTH)
