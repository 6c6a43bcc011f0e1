"""The three ways a planned move carries the KV (proxy/stream/move_kinds.py), end to end on real
sockets: simulated engines that transfer KV over their NIXL emulation, a stream moved by
recompute, hand-over and pre-copy, each token-exact against an unmoved run, and what the
target engine computed as its own metrics publish it.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.fleet import SimFleet, start_fleet
from tests.integration.test_movable_requests import (
    Streamed,
    engine_of,
    reference,
    set_fault,
    stream,
)
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
PATH = "/v1/completions"
# Long enough that the KV is worth moving and that a move lands mid-stream.
BODY: dict[str, Any] = {
    "model": MODEL,
    "prompt": "A long shared document about the sea. " * 120,
    "max_tokens": 300,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}
NIXL = {"kv_connector": "nixl"}


@pytest.fixture
async def fleet() -> Any:
    async with await start_fleet(3, speed=1.0) as f:
        yield f


def nixl_backends(f: SimFleet) -> list[dict[str, Any]]:
    """The first two engines behind the proxy; the third answers the reference runs."""
    return [{"url": u, "id": f"e{i}", "labels": NIXL} for i, u in enumerate(f.urls[:2])]


async def engine_metrics(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """`name` or `name{label}` (the one label that tells series apart) -> value."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families((await client.get(url + "/metrics")).text):
        for s in fam.samples:
            source = s.labels.get("source") or s.labels.get("kind") or ""
            key = f"{s.name}{{{source}}}" if source else s.name
            out[key] = out.get(key, 0.0) + s.value
    return out


async def proxy_series(client: httpx.AsyncClient, url: str, name: str) -> dict[str, float]:
    """The samples of `name` in the proxy's /metrics, keyed by their label text."""
    out: dict[str, float] = {}
    for line in (await client.get(url + "/metrics")).text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].split("} ")
            out[labels] = float(value)
    return out


async def moved_run(
    client: httpx.AsyncClient,
    url: str,
    fleet: SimFleet,
    kind: str,
    *,
    before_move: dict[str, Any] | None = None,
) -> tuple[Streamed, dict[str, Any]]:
    """One stream through the proxy, moved with `kind` after a few events; its answer and
    the migrate call's result."""
    results: list[dict[str, Any]] = []

    async def move_it(s: Streamed) -> None:
        rid, source = s.headers["x-request-id"], s.headers["x-fleet-backend"]
        if before_move is not None:
            await set_fault(client, fleet, source, **before_move)
        r = await client.post(url + f"/admin/requests/{rid}/migrate", json={"kind": kind})
        assert r.status_code == 200, r.text
        listed = (await client.get(url + "/admin/requests")).json()
        row = next(x for x in listed if x["request_id"] == rid)
        results.append({**r.json(), "legs": row["legs"]})

    got = await stream(client, url, PATH, BODY, after=6, action=move_it)
    [result] = results
    return got, result


def prompt_tokens(got: Streamed) -> int:
    usage = got.usage
    assert usage is not None
    return int(usage["prompt_tokens"])


async def test_a_recompute_move_prefills_every_moved_token_on_the_target(fleet: SimFleet) -> None:
    settings = fast_settings(nixl_backends(fleet), policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        ref = await reference(client, fleet, PATH, BODY)
        got, result = await moved_run(client, url, fleet, "recompute")
        assert not got.errors and got.done == 1
        assert got.text == ref.text and got.usage == ref.usage
        assert result["outcome"] == "ok" and result["kind"] == "recompute"
        target = await engine_metrics(client, engine_of(fleet, result["target"]).url)
        moved = prompt_tokens(got) + result["tokens"]
        # A fresh target: every token of prompt + generated was computed there.
        assert target["vllm:prompt_tokens_by_source_total{local_compute}"] == moved
        assert target["vllm:nixl_xfer_time_seconds_count"] == 0


async def test_a_handover_move_pulls_the_kv_from_the_source(fleet: SimFleet) -> None:
    settings = fast_settings(nixl_backends(fleet), policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        ref = await reference(client, fleet, PATH, BODY)
        got, result = await moved_run(client, url, fleet, "handover")
        assert not got.errors and got.done == 1
        assert got.text == ref.text and got.usage == ref.usage
        assert result["outcome"] == "ok" and result["kind"] == "handover"
        assert result["target"] not in (None, result["source"])
        assert [leg["kind"] for leg in result["legs"]] == [None, "handover"]
        moved = prompt_tokens(got) + result["tokens"]
        target = await engine_metrics(client, engine_of(fleet, result["target"]).url)
        # Nothing prefilled on the target: the KV of every moved token came over NIXL.
        assert target["vllm:prompt_tokens_by_source_total{local_compute}"] == 0
        assert target["vllm:prompt_tokens_by_source_total{external_kv_transfer}"] == moved
        assert target["vllm:nixl_xfer_time_seconds_count"] == 1
        # The source answered its 1-token leg from the aborted request's cached blocks.
        source = await engine_metrics(client, engine_of(fleet, result["source"]).url)
        assert source["vllm:prompt_tokens_by_source_total{local_cache_hit}"] >= moved - 2 * 16
        by_kind = await proxy_series(client, url, "fleet_proxy_migrations_by_kind_total")
        assert by_kind == {'kind="handover",outcome="ok"': 1.0}
        downtime = await proxy_series(
            client, url, "fleet_proxy_migration_downtime_by_kind_seconds_count"
        )
        assert downtime == {'kind="handover"': 1.0}
        legs = await proxy_series(client, url, "fleet_proxy_migration_kv_legs_total")
        assert legs == {'kind="handover",outcome="ok"': 1.0}


async def test_a_precopy_move_stages_the_kv_before_the_cut(fleet: SimFleet) -> None:
    settings = fast_settings(nixl_backends(fleet), policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        ref = await reference(client, fleet, PATH, BODY)
        got, result = await moved_run(client, url, fleet, "precopy")
        assert not got.errors and got.done == 1
        assert got.text == ref.text and got.usage == ref.usage
        assert result["outcome"] == "ok" and result["kind"] == "precopy"
        moved = prompt_tokens(got) + result["tokens"]
        target = await engine_metrics(client, engine_of(fleet, result["target"]).url)
        # The staging pull brought the KV over NIXL; the continuation found it cached and
        # computed only the tokens generated while staging ran (and a partial block).
        assert target["vllm:nixl_xfer_time_seconds_count"] == 1
        staged = target["vllm:prompt_tokens_by_source_total{external_kv_transfer}"]
        assert prompt_tokens(got) <= staged <= moved
        computed = target["vllm:prompt_tokens_by_source_total{local_compute}"]
        assert computed == moved - target["vllm:prompt_tokens_by_source_total{local_cache_hit}"]
        assert computed <= moved - staged + 16
        legs = await proxy_series(client, url, "fleet_proxy_migration_kv_legs_total")
        assert legs == {'kind="precopy",outcome="ok"': 1.0, 'kind="precopy",outcome="pull_ok"': 1.0}
        assert [leg["kind"] for leg in result["legs"]] == [None, "precopy"]


@pytest.mark.parametrize("kind", ["handover", "precopy"])
async def test_a_failing_kv_leg_falls_back_to_recompute(fleet: SimFleet, kind: str) -> None:
    settings = fast_settings(nixl_backends(fleet), policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        ref = await reference(client, fleet, PATH, BODY)
        # The source answers every new request with a 5xx: its KV leg fails, its stream goes on.
        got, result = await moved_run(client, url, fleet, kind, before_move={"error_rate": 1.0})
        assert not got.errors and got.done == 1
        assert got.text == ref.text and got.usage == ref.usage
        assert result["outcome"] == "ok" and result["kind"] == "recompute"
        legs = await proxy_series(client, url, "fleet_proxy_migration_kv_legs_total")
        assert legs == {f'kind="{kind}",outcome="status"': 1.0}
        by_kind = await proxy_series(client, url, "fleet_proxy_migrations_by_kind_total")
        assert by_kind == {'kind="recompute",outcome="ok"': 1.0}
        target = await engine_metrics(client, engine_of(fleet, result["target"]).url)
        assert target["vllm:nixl_xfer_time_seconds_count"] == 0


async def test_without_nixl_labels_every_kind_recomputes(fleet: SimFleet) -> None:
    plain = [{"url": u, "id": f"e{i}"} for i, u in enumerate(fleet.urls[:2])]
    settings = fast_settings(plain, policy="round_robin", move_kind="handover", debug_receipts=True)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        ref = await reference(client, fleet, PATH, BODY)
        results: list[dict[str, Any]] = []

        async def move_it(s: Streamed) -> None:
            rid = s.headers["x-request-id"]
            r = await client.post(url + f"/admin/requests/{rid}/migrate", json={})
            results.append(r.json())

        got = await stream(
            client, url, PATH, BODY, after=6, action=move_it, headers={"x-fleet-debug": "1"}
        )
        assert got.text == ref.text and not got.errors
        [result] = results
        assert result["outcome"] == "ok" and result["kind"] == "recompute"
        # The legs receipt names the kind of each continuation.
        assert b'"kind":"recompute"' in got.raw and b'"kind":null' in got.raw


@pytest.mark.parametrize(
    ("extra", "expected"), [({}, "handover"), ({"move_precopy_min_tokens": 500}, "precopy")]
)
async def test_auto_picks_the_kind_by_the_tokens_to_move(
    fleet: SimFleet, extra: dict[str, Any], expected: str
) -> None:
    settings = fast_settings(nixl_backends(fleet), policy="round_robin", **extra)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
        ref = await reference(client, fleet, PATH, BODY)
        got, result = await moved_run(client, url, fleet, "auto")
        # Some 900 tokens: past hand-over's break-even (222), below the default pre-copy 2048.
        assert 500 < prompt_tokens(got) < 2048
        assert not got.errors and got.text == ref.text and got.usage == ref.usage
        assert result["outcome"] == "ok" and result["kind"] == expected
