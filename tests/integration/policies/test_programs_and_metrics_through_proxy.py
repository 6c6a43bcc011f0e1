"""Autellix's program homes, the admin calls and the EPP metrics through the real proxy."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from policies.rendezvous import home, ranked
from simulator.fleet import SimFleet, start_fleet
from simulator.tokenizer import Tokenizer
from tests.support.servers import fast_settings, running_proxy
from tests.unit.policies.builders import backend

MODEL = "sim-llama-8b"
LARGE = "word " * 3000  # about 3,750 estimated tokens: above Autellix's 2048
SMALL = "word " * 40


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(3, speed=20.0, tokenizer=Tokenizer()) as f:
        yield f


async def complete(client: httpx.AsyncClient, prompt: str, program: str) -> str:
    r = await client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 2},
        headers={"x-program-id": program},
    )
    assert r.status_code == 200, r.text
    return r.headers["x-fleet-backend"]


async def test_autellix_keeps_large_calls_of_a_program_together(fleet: SimFleet) -> None:
    settings = fast_settings(fleet.urls, policy="autellix", admin_token="t")
    auth = {"x-admin-token": "t"}
    async with (
        running_proxy(settings) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        pool = [backend(u.removeprefix("http://")) for u in fleet.urls]  # the proxy's ids
        homes = {p: home(p, pool).id for p in ("a", "b", "c")}
        for _ in range(3):
            for p, h in homes.items():
                assert await complete(client, LARGE + p + " more", p) == h
        small = {await complete(client, SMALL, "a") for _ in range(3)}
        assert len(small) == 3  # small calls ignore the home and spread

        stats = (await client.get("/admin/policy", headers=auth)).json()["stats"]["autellix"]
        assert (stats["large_requests"], stats["locality_hits"], stats["active_programs"]) == (
            9,
            6,
            3,
        )
        assert (await client.delete("/admin/programs/a", headers=auth)).status_code == 200
        assert (await client.delete("/admin/programs/a", headers=auth)).status_code == 404
        stats = (await client.get("/admin/policy", headers=auth)).json()["stats"]["autellix"]
        assert stats["active_programs"] == 2 and stats["ended_programs"] == 1

        # Removing a backend sends its programs to their next-ranked backend.
        gone = homes["b"]
        assert (await client.delete(f"/admin/backends/{gone}", headers=auth)).status_code == 200
        assert await complete(client, LARGE + "b again", "b") == ranked("b", pool)[1].id
        stats = (await client.get("/admin/policy", headers=auth)).json()["stats"]["autellix"]
        assert stats["reassignments"] == 1


async def test_epp_metrics_on_the_proxy_metrics_endpoint(fleet: SimFleet) -> None:
    async with (
        running_proxy(fast_settings(fleet.urls, policy="lmetric")) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        for i in range(4):
            await complete(client, LARGE + str(i), "p")
        text = (await client.get("/metrics")).text
    values: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(("inference_extension_", "inference_pool_")):
                values[s.name] = values.get(s.name, 0.0) + s.value
    assert values["inference_extension_scheduler_attempts_total"] == 4
    assert values["inference_extension_scheduler_e2e_duration_seconds_count"] == 4
    assert values["inference_pool_ready_pods"] == 3
    assert values["inference_extension_prefix_indexer_size"] > 0
    assert values["inference_extension_plugin_duration_seconds_count"] == 4
