"""KubernetesConnector against an in-memory Kubernetes (FakeKube) and proxy (FakeAdmin)."""

from __future__ import annotations

import pytest

from fleet.clock import FakeClock
from fleet.kube import DELETION_COST, ScaleTarget
from fleet.types import Role
from planner.config import PlannerRole
from planner.drain import DrainTimeout
from planner.events import Journal
from planner.kubernetes import (
    KubernetesConnector,
    KubernetesSettings,
    KubeRole,
    default_selector,
    highest_ordinal,
)
from planner.proxy_admin import LiveRequest
from tests.support.fake_kube import FakeKube, ready_pod
from tests.unit.planner.fake_admin import FakeAdmin

DECODE = PlannerRole.DECODE


def connector(
    kube: FakeKube, admin: FakeAdmin, target: str = "deployment/dec", **kw: object
) -> KubernetesConnector:
    settings = KubernetesSettings(
        namespace="ns",
        roles={DECODE: KubeRole(ScaleTarget.parse(target), "app=dec")},
        poll_s=0.0,
        **kw,  # type: ignore[arg-type]
    )
    return KubernetesConnector(admin, kube, settings, clock=FakeClock(), events=Journal())


def journal(c: KubernetesConnector) -> Journal:
    assert isinstance(c.events, Journal)
    return c.events


def finish_after_evacuate(admin: FakeAdmin) -> None:
    """The requests are moved or finish once the drain has begun."""
    if any(kind == "evacuate" for kind, _ in admin.calls):
        admin.live.clear()


async def started(kube: FakeKube, admin: FakeAdmin, c: KubernetesConnector, n: int) -> None:
    await c.set_replicas(DECODE, n)
    admin.calls.clear()
    kube.calls.clear()


async def test_scale_up_waits_for_ready_pods_then_registers_them() -> None:
    kube, admin = FakeKube(ready_after_polls=3), FakeAdmin()
    c = connector(kube, admin)
    await c.set_replicas(DECODE, 2)
    assert kube.replicas == {"deployment/dec": 2}
    assert all(p.ready for p in kube.pods.values())  # it waited until both were Ready
    assert sorted(admin.calls) == [("add", "dec-0"), ("add", "dec-1")]
    workers = await c.workers(DECODE)
    assert {(w.id, w.url) for w in workers} == {
        ("dec-0", "http://10.0.0.1:8000"),
        ("dec-1", "http://10.0.0.2:8000"),
    }
    await c.set_replicas(DECODE, 3)  # only the new pod is registered
    assert admin.calls[-1] == ("add", "dec-2")
    assert len(admin.calls) == 3


async def test_scale_up_without_register_leaves_the_proxy_alone() -> None:
    kube, admin = FakeKube(), FakeAdmin()
    await connector(kube, admin, register=False).set_replicas(DECODE, 2)
    assert admin.calls == []
    assert kube.replicas == {"deployment/dec": 2}


async def test_scale_up_gives_up_when_pods_never_get_ready() -> None:
    kube, admin = FakeKube(ready_after_polls=10**9), FakeAdmin()
    c = connector(kube, admin, start_timeout_s=0.0)
    with pytest.raises(TimeoutError, match="Ready"):
        await c.set_replicas(DECODE, 1)
    assert admin.calls == []


async def test_workers_leave_out_unready_and_terminating_pods() -> None:
    from datetime import UTC, datetime

    kube, admin = FakeKube(), FakeAdmin()
    kube.pods = {
        "a": ready_pod("a", "10.0.0.1"),
        "b": ready_pod("b", "10.0.0.2", deletion_timestamp=datetime.now(UTC)),
        "c": ready_pod("c", "10.0.0.3", ready=False),
    }
    assert [w.id for w in await connector(kube, admin).workers(DECODE)] == ["a"]


async def test_scale_down_drains_the_cheapest_then_marks_it_then_lowers_replicas() -> None:
    kube, admin = FakeKube(), FakeAdmin()
    c = connector(kube, admin)
    await started(kube, admin, c, 3)
    admin.live = [LiveRequest("dec-0", 500, 10), LiveRequest("dec-1", 20, 0),
                  LiveRequest("dec-2", 300, 0)]  # fmt: skip
    admin.on_poll = finish_after_evacuate
    await c.set_replicas(DECODE, 2)
    assert admin.calls[:2] == [("drain", "dec-1"), ("evacuate", "dec-1")]
    assert ("remove", "dec-1") in admin.calls
    assert kube.calls == [("annotate", "dec-1"), ("scale", "deployment/dec=2")]
    assert sorted(kube.pods) == ["dec-0", "dec-2"]  # the controller removed exactly that one
    assert [r.outcome.value for r in c.last_drains] == ["drained"]
    # The drain is reported (metrics, TensorBoard, the status view hear it).
    assert [(d.role, d.report.worker_id) for d in journal(c).drains] == [(DECODE, "dec-1")]


async def test_drain_timeout_leaves_replicas_alone() -> None:
    kube, admin = FakeKube(), FakeAdmin()
    c = connector(kube, admin, drain_deadline_s=0.0)
    await started(kube, admin, c, 2)
    admin.live = [LiveRequest("dec-0", 10, 0), LiveRequest("dec-1", 10, 0)]
    admin.stuck = {0, 1}
    with pytest.raises(DrainTimeout):
        await c.set_replicas(DECODE, 1)
    assert kube.calls == []  # no annotation, no scale change
    assert kube.replicas == {"deployment/dec": 2}
    assert ("undrain", "dec-0") in admin.calls
    assert not admin.backends_by_id["dec-0"].draining
    assert [d.report.outcome.value for d in journal(c).drains] == ["drain_timeout"]


async def test_statefulset_victim_is_the_highest_ordinal() -> None:
    kube, admin = FakeKube(), FakeAdmin()
    c = connector(kube, admin, target="statefulset/dec")
    await started(kube, admin, c, 3)
    # The highest ordinal is the busiest: the StatefulSet removes it all the same.
    admin.live = [LiveRequest("dec-2", 900, 0)]
    admin.on_poll = finish_after_evacuate
    await c.set_replicas(DECODE, 2)
    assert admin.calls[0] == ("drain", "dec-2")
    assert kube.calls == [("scale", "statefulset/dec=2")]  # deletion cost means nothing there
    assert sorted(kube.pods) == ["dec-0", "dec-1"]


async def test_pods_not_ready_yet_are_dropped_without_draining() -> None:
    kube, admin = FakeKube(), FakeAdmin()
    c = connector(kube, admin)
    await started(kube, admin, c, 1)
    kube.replicas["deployment/dec"] = 3  # two more asked for, not Ready yet
    await c.set_replicas(DECODE, 1)
    assert admin.calls == []
    assert kube.calls == [("scale", "deployment/dec=1")]


def test_highest_ordinal_and_default_selector() -> None:
    pods = [ready_pod(n, "10.0.0.1") for n in ("w-2", "w-10", "w-9")]
    assert highest_ordinal(pods).name == "w-10"
    assert (
        default_selector("llama", DECODE) == "fleet-proxy.io/model=llama,fleet-proxy.io/role=decode"
    )
    assert DELETION_COST == "controller.kubernetes.io/pod-deletion-cost"


def test_scale_target_parsing() -> None:
    assert str(ScaleTarget.parse("Deployment/x")) == "deployment/x"
    for bad in ("x", "pod/x", "deployment/"):
        with pytest.raises(ValueError, match="deployment/NAME"):
            ScaleTarget.parse(bad)
    assert Role.DECODE.value == "decode"
