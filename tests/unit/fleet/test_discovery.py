"""Discovery's pure parts: the per-source reconcile on hand-built sets, and which pods become
which backends; then the Kubernetes source over an in-memory KubeApi."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from fleet.discovery import ADMIN, KUBERNETES, STATIC, Desired, Plan, StaticSource, reconcile
from fleet.kube import EventType, Gone, PodList, WatchEvent
from fleet.pod_backends import KubernetesSource, backend_from_pod, desired_from_pods
from fleet.types import BackendSpec, Role
from tests.support.fake_kube import FakeKube, ready_pod
from tests.support.polling import eventually


def spec(backend_id: str, url: str = "", source: str = KUBERNETES, **kw: object) -> BackendSpec:
    return replace(
        BackendSpec(id=backend_id, url=url or f"http://{backend_id}:8000", source=source), **kw
    )


def want(*specs: BackendSpec) -> Desired:
    return {s.id: s for s in specs}


def test_an_empty_registry_gets_every_wanted_backend_in_the_sources_order() -> None:
    # The order a source gives (the settings' list) is the fleet's order: not re-sorted.
    plan = reconcile(KUBERNETES, [], want(spec("b"), spec("a")))
    assert [s.id for s in plan.add] == ["b", "a"]
    assert plan.remove == plan.update == plan.conflicts == ()


def test_a_source_never_touches_another_sources_backends() -> None:
    current = [spec("s", source=STATIC), spec("adm", source=ADMIN), spec("k")]
    # Kubernetes wants none of its own and one id that the admin API holds.
    plan = reconcile(KUBERNETES, current, want(spec("adm", url="http://other:1")))
    assert plan.remove == ("k",)
    assert plan.add == () and plan.update == ()
    assert plan.conflicts == ("adm",)
    # And the static source, wanting nothing, removes only its own.
    assert reconcile(STATIC, current, {}).remove == ("s",)


def test_what_a_source_publishes_is_tagged_with_its_name() -> None:
    plan = reconcile(KUBERNETES, [], want(spec("a", source=STATIC)))
    assert plan.add[0].source == KUBERNETES


def test_a_new_url_or_instance_under_the_same_id_replaces_the_backend() -> None:
    current = [spec("p", url="http://10.0.0.1:8000", instance="uid-1")]
    moved = reconcile(KUBERNETES, current, want(spec("p", url="http://10.0.0.2:8000",
                                                     instance="uid-1")))  # fmt: skip
    recreated = reconcile(KUBERNETES, current, want(spec("p", url="http://10.0.0.1:8000",
                                                         instance="uid-2")))  # fmt: skip
    # Removed first, never updated in place; the new one is added once the old is gone.
    for plan in (moved, recreated):
        assert plan == Plan(remove=("p",))
    assert reconcile(KUBERNETES, [], want(spec("p", instance="uid-2"))).add[0].instance == "uid-2"


def test_other_fields_change_in_place_and_learned_models_are_no_change() -> None:
    have = spec("p", role=Role.BOTH, models=("m",))
    assert reconcile(KUBERNETES, [have], want(spec("p"))) == Plan()
    plan = reconcile(KUBERNETES, [have], want(spec("p", role=Role.DECODE, node="n1")))
    assert plan.update == (spec("p", role=Role.DECODE, node="n1"),)
    assert plan.add == plan.remove == ()


def test_a_backend_on_its_way_out_is_left_alone_until_gone() -> None:
    current = [spec("p", instance="old")]
    plan = reconcile(KUBERNETES, current, want(spec("p", instance="new")), retiring={"p"})
    assert plan == Plan()
    assert reconcile(KUBERNETES, current, {}, retiring={"p"}) == Plan()
    # Gone from the registry: now the replacement is added.
    plan = reconcile(KUBERNETES, [], want(spec("p", instance="new")), retiring=set())
    assert [s.instance for s in plan.add] == ["new"]


async def test_the_static_source_publishes_its_list_once() -> None:
    got: list[Desired] = []
    source = StaticSource([BackendSpec(id="a", url="http://a")])
    await source.run(got.append)
    assert [list(d) for d in got] == [["a"]] and got[0]["a"].source == STATIC


def test_a_pod_is_a_backend_by_its_name_ip_port_and_labels() -> None:
    pod = ready_pod(
        "vllm-0",
        "10.1.2.3",
        uid="u-1",
        node_name="gpu-7",
        labels={"fleet-proxy.io/role": "decode", "fleet-proxy.io/unit": "u"},
        annotations={
            "fleet-proxy.io/port": "8123",
            "fleet-proxy.io/role": "prefill",  # the label wins
            "labels.fleet-proxy.io/kv_connector": "nixl",
        },
    )
    assert backend_from_pod(pod, 8000) == BackendSpec(
        id="vllm-0",
        url="http://10.1.2.3:8123",
        role=Role.DECODE,
        node="gpu-7",
        unit="u",
        labels={"kv_connector": "nixl"},
        source=KUBERNETES,
        instance="u-1",
    )
    bare = backend_from_pod(ready_pod("p", "fd00::5", annotations={"fleet-proxy.io/node": "n"}), 9)
    assert (bare.url, bare.role, bare.node, bare.unit) == ("http://[fd00::5]:9", Role.BOTH, "n", "")


def test_a_pods_kv_events_ports_become_its_event_endpoints_at_its_ip() -> None:
    annotations = {
        "fleet-proxy.io/kv-events-port": "5557",
        "fleet-proxy.io/kv-events-replay-port": "5558",
    }
    spec_v4 = backend_from_pod(ready_pod("a", "10.0.0.9", annotations=annotations), 8000)
    assert spec_v4.kv_events_endpoint == "tcp://10.0.0.9:5557"
    assert spec_v4.kv_events_replay_endpoint == "tcp://10.0.0.9:5558"
    only_events = {"fleet-proxy.io/kv-events-port": "6000"}
    spec_v6 = backend_from_pod(ready_pod("b", "fd00::7", annotations=only_events), 8000)
    assert (spec_v6.kv_events_endpoint, spec_v6.kv_events_replay_endpoint) == (
        "tcp://[fd00::7]:6000",
        "",
    )
    assert backend_from_pod(ready_pod("c", "10.0.0.1"), 8000).kv_events_endpoint == ""
    bad = [
        ready_pod("x", "10.0.0.2", annotations={"fleet-proxy.io/kv-events-port": "0"}),
        ready_pod("y", "10.0.0.3", annotations={"fleet-proxy.io/kv-events-replay-port": "9"}),
    ]
    _, faults = desired_from_pods(bad, 8000)
    assert "kv-events-port '0'" in faults["x"]
    assert "kv-events-replay-port needs" in faults["y"]


def test_only_serving_pods_are_wanted_and_bad_annotations_are_named() -> None:
    pods = [
        ready_pod("ok", "10.0.0.1"),
        ready_pod("starting", "10.0.0.2", ready=False),
        ready_pod("ending", "10.0.0.3", deletion_timestamp=datetime.now(UTC)),
        ready_pod("no-ip", "", ready=True),
        ready_pod("bad-role", "10.0.0.4", labels={"fleet-proxy.io/role": "boss"}),
        ready_pod("bad-port", "10.0.0.5", annotations={"fleet-proxy.io/port": "99999"}),
    ]
    desired, faults = desired_from_pods(pods, 8000)
    assert list(desired) == ["ok"]
    assert set(faults) == {"bad-role", "bad-port"}
    assert "fleet-proxy.io/role 'boss'" in faults["bad-role"]


class ChangedWhileAway(FakeKube):
    """After its first listing, `a` is gone and `c` has come, with no watch event saying so."""

    async def list_pods(self, namespace: str, selector: str) -> PodList:
        if self.version > 100:
            self.pods = {"b": replace(self.pods["b"], ready=True), "c": ready_pod("c", "10.0.0.3")}
        return await super().list_pods(namespace, selector)


async def test_the_kubernetes_source_publishes_on_changes_and_lists_again_after_410() -> None:
    a, b = ready_pod("a", "10.0.0.1", uid="1"), ready_pod("b", "10.0.0.2", ready=False, uid="2")
    kube = ChangedWhileAway(pods={"a": a, "b": b})
    kube.watch_scripts = [
        [
            WatchEvent(EventType.BOOKMARK, "150"),  # no change: nothing published
            WatchEvent(EventType.MODIFIED, "151", replace(b, ready=True)),
            Gone("too old"),
        ],
    ]
    published: list[list[str]] = []
    source = KubernetesSource(kube, "ns", "fleet-proxy.io/model", 8000, max_backoff_s=0.0)
    task = asyncio.create_task(source.run(lambda d: published.append(sorted(d))))
    try:
        # Once per scheduler turn: the fake API answers without a clock.
        await eventually(lambda: len(published) >= 3, within=5, what="three publications", every=0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert published[:3] == [["a"], ["a", "b"], ["b", "c"]]
    assert source.watcher.lists == 2
    assert kube.watch_calls[:2] == ["101", "102"]  # each watch from its list's version
