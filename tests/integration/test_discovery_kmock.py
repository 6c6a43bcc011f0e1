"""Pod discovery end to end: a real proxy on a real port, its kubeconfig pointing at kmock (an
emulated Kubernetes API over HTTP on 127.0.0.1), simulated engines behind the pods.

Every pod's IP is 127.0.0.1 and its `fleet-proxy.io/port` annotation names one engine's port.
kmock ignores label selectors and resourceVersions and sends neither bookmarks nor 410 unless
told (tests/integration/test_kube_kmock.py); the 410 test tells it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import kmock
import pytest

from simulator.fleet import start_fleet
from tests.integration.test_movable_requests import (
    Streamed,
    body_for,
    migrations,
    reference,
    stream,
)
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

NS = "llm"
PODS = f"/api/v1/namespaces/{NS}/pods"
PATH = "/v1/completions"


def pod(name: str, port: int, uid: str, ready: bool = True) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}] if ready else []
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "labels": {"fleet-proxy.io/model": "sim-llama-8b"},
            "annotations": {"fleet-proxy.io/port": str(port)},
        },
        "status": {"podIP": "127.0.0.1", "phase": "Running", "conditions": conditions},
    }


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: kmock, cluster: {{server: "{server}"}}}}]
users: [{{name: anonymous, user: {{}}}}]
contexts: [{{name: kmock, context: {{cluster: kmock, user: anonymous}}}}]
current-context: kmock
"""
    )
    return path


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[kmock.KubernetesEmulator, str]]:
    async with kmock.KubernetesEmulator() as k, kmock.Server(k, host="127.0.0.1") as srv:
        k.resources["v1/pods"] = {}  # known before any pod exists: an empty list, not a 404
        yield k, str(srv.url).rstrip("/")


async def kube(method: str, url: str, body: dict[str, Any] | None = None) -> None:
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body) as r:
        r.raise_for_status()


def discovering(tmp_path: Path, base: str) -> Any:
    return fast_settings(
        [],
        policy="round_robin",
        discovery_kubernetes=True,
        discovery_namespace=NS,
        discovery_kubeconfig=kubeconfig(tmp_path, base),
    )


async def backends(client: httpx.AsyncClient, url: str) -> dict[str, dict[str, Any]]:
    return {b["id"]: b for b in (await client.get(url + "/admin/backends")).json()}


async def routable(client: httpx.AsyncClient, url: str, backend_id: str) -> bool:
    b = (await backends(client, url)).get(backend_id)
    return b is not None and b["routable"]


async def answered_by(client: httpx.AsyncClient, url: str) -> str:
    body = {"model": "sim-llama-8b", "prompt": "Hello", "max_tokens": 4}
    r = await client.post(url + PATH, json=body)
    assert r.status_code == 200, r.text
    return r.headers["x-fleet-backend"]


@pytest.mark.slow
async def test_pods_are_routed_once_ready_and_leave_without_losing_a_request(
    emulator: Any, tmp_path: Path
) -> None:
    _, base = emulator
    # Two engines behind pods; the third answers the reference run.
    async with await start_fleet(3, speed=1.0) as sims:
        port1, port2 = (urlsplit(u).port or 0 for u in sims.urls[:2])
        settings = discovering(tmp_path, base)
        async with (
            running_proxy(settings, wait_ready=False) as (url, app),
            httpx.AsyncClient(timeout=30) as client,
        ):
            await kube("POST", base + PODS, pod("p1", port1, "u1", ready=False))
            await kube("POST", base + PODS, pod("p2", port2, "u2"))
            await eventually(lambda: routable(client, url, "p2"))
            # p1 came first but is not Ready: not a backend, no request goes there.
            assert list(await backends(client, url)) == ["p2"]
            assert {await answered_by(client, url) for _ in range(3)} == {"p2"}

            ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            await kube("PATCH", base + PODS + "/p1", ready)
            await eventually(lambda: routable(client, url, "p1"))
            await client.post(url + "/admin/backends/p2/drain")
            assert await answered_by(client, url) == "p1"  # a real request reaches its engine

            # p1's pod goes away with a stream on it: moved to p2, then p1 is removed.
            body = body_for(PATH, max_tokens=300)
            ref = await reference(client, sims, PATH, dict(body))

            async def pod_deleted(s: Streamed) -> None:
                assert s.headers["x-fleet-backend"] == "p1"
                await client.post(url + "/admin/backends/p2/undrain")
                await kube("DELETE", base + PODS + "/p1")

            got = await stream(client, url, PATH, body, after=3, action=pod_deleted)
            assert got.done == 1 and not got.errors and got.text == ref.text
            assert (await migrations(client, url)).get(("discovery", "ok")) == 1.0
            await eventually(lambda: app.core.fleet.get("p1") is None)
            p2_before = (await backends(client, url))["p2"]
            assert p2_before["load"]["dispatched_total"] >= 1

            # A new pod gets p1's old address: a new backend, nothing of p1's carried over.
            await kube("POST", base + PODS, pod("p3", port1, "u3"))
            await eventually(lambda: routable(client, url, "p3"))
            p3 = (await backends(client, url))["p3"]
            assert (p3["source"], p3["instance"]) == ("kubernetes", "u3")
            assert p3["load"]["dispatched_total"] == 0

            # p2 is recreated under its name (a new uid): replaced, not updated in place.
            await kube("DELETE", base + PODS + "/p2")
            await kube("POST", base + PODS, pod("p2", port2, "u2-new"))

            async def p2_replaced() -> bool:
                b = (await backends(client, url)).get("p2")
                return b is not None and b["instance"] == "u2-new" and b["routable"]

            await eventually(p2_replaced)
            assert (await backends(client, url))["p2"]["load"]["dispatched_total"] == 0


async def test_a_410_makes_discovery_list_again_and_see_what_it_missed(
    emulator: Any, tmp_path: Path
) -> None:
    k, base = emulator
    await kube("POST", base + PODS, pod("p1", 1, "u1"))
    await kube("POST", base + PODS, pod("p2", 2, "u2"))
    expired = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    answered: list[int] = []

    def first_watch_expires() -> Any:
        answered.append(1)
        if len(answered) > 1:
            return None  # kmock's own watch from here on
        # While this watch was away p2 went: no event will say so, only a new list.
        del k.objects[kmock.resource("v1/pods"), NS, "p2"]
        return (expired,)

    k[kmock.action.WATCH] << first_watch_expires
    settings = discovering(tmp_path, base)
    async with running_proxy(settings, wait_ready=False) as (_, app):
        await eventually(lambda: app.control_app.state.discovery is not None)
        watcher = app.control_app.state.discovery.source.watcher
        await eventually(lambda: watcher.lists >= 2 and {b.id for b in app.core.fleet} == {"p1"})
    lists = [r for r in k if r.method == kmock.method.GET and r.params.get("watch") != "true"]
    assert len(lists) >= 2
