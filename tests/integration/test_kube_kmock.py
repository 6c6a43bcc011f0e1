"""fleet/kube_client.py and the Kubernetes connector over real HTTP against kmock, an emulated
Kubernetes API with state, list and watch, on 127.0.0.1.

What kmock does not emulate, and how these tests stand in for it: it serves no
resourceVersions (a list answers "..."), ignores label selectors and a watch's
resourceVersion (a watch first replays every object as ADDED), sends no bookmarks and never
answers 410. So the bookmark and 410 tests configure the emulator's watch answer explicitly,
and each namespace here holds only the pods of one selector. It has no controllers either:
`ReplicaSetController` (tests/support) plays the ReplicaSet controller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kmock
import pytest

from fleet.clock import SystemClock
from fleet.kube import DELETION_COST, EventType, Gone, ScaleTarget, WatchEvent
from fleet.kube_client import kube_api
from fleet.pod_watch import PodWatcher
from planner.config import PlannerRole
from planner.kubernetes import KubernetesConnector, KubernetesSettings, KubeRole
from planner.proxy_admin import LiveRequest
from tests.support.kube_controller import ReplicaSetController
from tests.support.polling import eventually
from tests.unit.planner.fake_admin import FakeAdmin

NS = "ns"
DEP = ScaleTarget.parse("deployment/dec")
LABELS = {"fleet-proxy.io/model": "m", "fleet-proxy.io/role": "decode"}
SELECTOR = "fleet-proxy.io/model=m,fleet-proxy.io/role=decode"


def pod(name: str, ip: str, ready: bool = True) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}] if ready else []
    return {
        "metadata": {"name": name, "namespace": NS, "labels": LABELS},
        "status": {"podIP": ip, "phase": "Running", "conditions": conditions},
    }


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[kmock.KubernetesEmulator, str]]:
    async with kmock.KubernetesEmulator() as k, kmock.Server(k, host="127.0.0.1") as srv:
        k.resources["v1/pods"] = {}  # known before any pod exists: an empty list, not a 404
        yield k, str(srv.url).rstrip("/")


async def post(base: str, path: str, body: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s, s.post(base + path, json=body) as r:
        r.raise_for_status()


async def seed(base: str, replicas: int, pods: list[dict[str, Any]]) -> None:
    deployment = {
        "metadata": {"name": "dec", "namespace": NS},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas},
    }
    await post(base, f"/apis/apps/v1/namespaces/{NS}/deployments", deployment)
    for p in pods:
        await post(base, f"/api/v1/namespaces/{NS}/pods", p)


async def collect(it: AsyncIterator[WatchEvent], n: int) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    async with asyncio.timeout(10):
        async for e in it:
            out.append(e)
            if len(out) == n:
                break
    return out


async def test_scale_subresource_read_and_patch(emulator: Any) -> None:
    _, base = emulator
    await seed(base, 2, [])
    async with kube_api(base_url=base) as api:
        assert await api.get_scale(NS, DEP) == 2
        await api.set_scale(NS, DEP, 5)
        assert await api.get_scale(NS, DEP) == 5
    k, _ = emulator
    patch = next(r for r in k if r.method == kmock.method.PATCH)
    assert str(patch.url).endswith("/deployments/dec/scale")
    assert patch.data == {"spec": {"replicas": 5}}


async def test_list_watch_annotate_delete(emulator: Any) -> None:
    k, base = emulator
    await seed(base, 1, [pod("dec-1", "10.0.0.1"), pod("dec-2", "10.0.0.2", ready=False)])
    async with kube_api(base_url=base) as api:
        listing = await api.list_pods(NS, SELECTOR)
        assert {p.name: p.serving for p in listing.pods} == {"dec-1": True, "dec-2": False}
        assert listing.resource_version  # kmock's is a placeholder, passed on as it is
        events = api.watch_pods(NS, SELECTOR, listing.resource_version, 30)
        replayed = await collect(events, 2)  # kmock replays what exists as ADDED
        assert {e.type for e in replayed} == {EventType.ADDED}
        await api.annotate_pod(NS, "dec-1", {DELETION_COST: "-5"})
        await api.delete_pod(NS, "dec-2")
        await api.delete_pod(NS, "dec-2")  # already gone: no error
        changed = await collect(events, 2)
        await events.aclose()  # type: ignore[attr-defined]
    assert [(e.type, e.pod and e.pod.name) for e in changed] == [
        (EventType.MODIFIED, "dec-1"),
        (EventType.DELETED, "dec-2"),
    ]
    assert changed[0].pod is not None and changed[0].pod.annotations[DELETION_COST] == "-5"
    watch = next(r for r in k if r.params.get("watch") == "true")
    assert watch.params["resourceVersion"] == listing.resource_version
    assert watch.params["allowWatchBookmarks"] == "true"
    assert watch.params["labelSelector"] == SELECTOR


async def test_watch_bookmark_then_410_makes_the_watcher_relist(emulator: Any) -> None:
    k, base = emulator
    await seed(base, 1, [pod("dec-1", "10.0.0.1")])
    # kmock sends neither bookmarks nor 410, so its watch answer is set here: the first watch
    # a bookmark (then the server ends it), the second the API server's in-stream 410 (an
    # ERROR event with a Status of code 410), every later one an HTTP 410.
    bookmark = {
        "type": "BOOKMARK",
        "object": {"kind": "Pod", "metadata": {"resourceVersion": "77"}},
    }
    expired = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    answers: list[Any] = [(bookmark,), (expired,)]

    def answer() -> Any:
        if answers:
            return answers.pop(0)
        raise kmock.KubernetesError(status=410, reason="Gone", message="too old")

    k[kmock.action.WATCH] << answer
    async with kube_api(base_url=base) as api:
        watcher = PodWatcher(api, NS, SELECTOR, watch_timeout_s=30, max_backoff_s=0.05)
        task = asyncio.create_task(watcher.run())
        try:
            await eventually(lambda: watcher.lists >= 3, what="three pod lists", every=0.02)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with pytest.raises(Gone):  # the HTTP 410 form, straight from the API
            await collect(api.watch_pods(NS, SELECTOR, "5", 30), 1)
    # Listed, watched from the list's version, then from the bookmark's; the in-stream 410
    # made it list again, and the HTTP 410 once more.
    assert watcher.lists >= 3
    assert set(watcher.state.pods) == {"dec-1"}
    rvs = [r.params.get("resourceVersion") for r in k if r.params.get("watch") == "true"]
    assert rvs[:3] == ["...", "77", "..."]


def _settings(**kw: Any) -> KubernetesSettings:
    return KubernetesSettings(
        namespace=NS,
        roles={PlannerRole.DECODE: KubeRole(DEP, SELECTOR)},
        poll_s=0.02,
        start_timeout_s=20,
        stop_timeout_s=20,
        **kw,
    )


async def test_connector_scales_a_deployment_up_and_down(emulator: Any) -> None:
    k, base = emulator
    await seed(base, 0, [])
    admin = FakeAdmin()
    async with aiohttp.ClientSession() as session, kube_api(base_url=base) as api:
        controller = ReplicaSetController(session, base, NS, "dec", LABELS)
        ctl = asyncio.create_task(controller.run())
        try:
            c = KubernetesConnector(admin, api, _settings(), clock=SystemClock())
            await c.set_replicas(PlannerRole.DECODE, 3)
            assert sorted(admin.backends_by_id) == ["dec-1", "dec-2", "dec-3"]
            urls = {w.id: w.url for w in await c.workers(PlannerRole.DECODE)}
            assert urls["dec-2"] == "http://10.0.0.2:8000"
            admin.live = [LiveRequest("dec-1", 400, 0), LiveRequest("dec-3", 300, 0)]
            admin.on_poll = lambda a: (
                a.live.clear() if any(x[0] == "evacuate" for x in a.calls) else None
            )
            await c.set_replicas(PlannerRole.DECODE, 2)
        finally:
            ctl.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ctl
    assert controller.deleted == ["dec-2"]  # the idle pod: drained, marked, then removed
    assert ("drain", "dec-2") in admin.calls and ("remove", "dec-2") in admin.calls
    assert sorted(admin.backends_by_id) == ["dec-1", "dec-3"]
    deployment = k.objects[kmock.resource("apps/v1/deployments"), NS, "dec"]
    assert deployment["spec"]["replicas"] == 2
    # The pod was marked with the lowest deletion cost before the replicas were lowered.
    patches = [r for r in k if r.method == kmock.method.PATCH]
    mark, scale = patches[-2:]
    assert mark.url.path == f"/api/v1/namespaces/{NS}/pods/dec-2"
    assert mark.data == {"metadata": {"annotations": {DELETION_COST: "-2147483648"}}}
    assert scale.url.path == f"/apis/apps/v1/namespaces/{NS}/deployments/dec/scale"
    assert scale.data == {"spec": {"replicas": 2}}
