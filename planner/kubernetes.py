"""`KubernetesConnector`: workers as the pods of a Deployment or StatefulSet, one per role.

Scale-up patches the target's Scale subresource, waits (bounded) until that many pods are
Ready, and registers each Ready pod the proxy does not know yet (POST /admin/backends; id: the
pod's name, URL: http://<podIP>:<engine port>), unless `register` is off because the proxy
discovers pods itself.

Scale-down drains one pod through the proxy first (planner/drain.py), and only once it is
drained marks it with the lowest `controller.kubernetes.io/pod-deletion-cost` and lowers the
replicas, so the ReplicaSet controller removes exactly that pod; then it waits (bounded) until
the pod is gone. The victim of a Deployment is the cheapest to drain (`choose_victim`). A
StatefulSet always removes its highest ordinal and ignores deletion cost, so its victim is the
highest-ordinal pod. A drain that times out raises `DrainTimeout` with the replicas unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleet.clock import Clock, SystemClock
from fleet.kube import (
    DELETION_COST,
    LOWEST_DELETION_COST,
    KubeApi,
    PodInfo,
    ScaleKind,
    ScaleTarget,
)
from fleet.types import Role
from planner.config import PlannerRole
from planner.connector import WorkerInfo
from planner.drain import DrainReport, choose_victim, drain, drained_or_raise, live_tokens
from planner.events import NoEvents, PlannerEvents
from planner.proxy_admin import ProxyAdmin

log = logging.getLogger("fleet_proxy.planner")


@dataclass(frozen=True, slots=True)
class KubeRole:
    """What one planner role scales and which pods are its workers."""

    target: ScaleTarget
    selector: str  # label selector of the role's pods


def default_selector(model: str, role: PlannerRole) -> str:
    return f"fleet-proxy.io/model={model},fleet-proxy.io/role={role.value}"


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    namespace: str
    roles: Mapping[PlannerRole, KubeRole]
    engine_port: int = 8000
    register: bool = True  # False: the proxy discovers the pods itself
    # The role a worker is registered with: an aggregated fleet's decode workers are `both`.
    backend_roles: Mapping[PlannerRole, Role] = field(
        default_factory=lambda: {PlannerRole.PREFILL: Role.PREFILL, PlannerRole.DECODE: Role.DECODE}
    )
    start_timeout_s: float = 600.0  # a real engine loads its weights first
    drain_deadline_s: float = 120.0
    stop_timeout_s: float = 300.0  # for the drained pod to be gone
    poll_s: float = 1.0


_ORDINAL = re.compile(r"-(\d+)$")


def highest_ordinal(pods: Sequence[PodInfo]) -> PodInfo:
    """The pod a StatefulSet removes on a scale-down: the highest `<name>-<ordinal>`."""
    if not pods:
        raise ValueError("no pod to choose from")

    def ordinal(p: PodInfo) -> int:
        m = _ORDINAL.search(p.name)
        return int(m.group(1)) if m else -1

    return max(pods, key=ordinal)


class KubernetesConnector:
    def __init__(
        self,
        proxy: ProxyAdmin,
        kube: KubeApi,
        settings: KubernetesSettings,
        clock: Clock | None = None,
        events: PlannerEvents | None = None,
    ) -> None:
        self.proxy = proxy
        self.events: PlannerEvents = events or NoEvents()
        self.kube = kube
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.last_drains: list[DrainReport] = []

    def _role(self, role: PlannerRole) -> KubeRole:
        spec = self.settings.roles.get(role)
        if spec is None:
            raise RuntimeError(f"no Kubernetes target for the {role} role")
        return spec

    async def serving_pods(self, role: PlannerRole) -> list[PodInfo]:
        """The role's Ready, not-terminating pods."""
        listing = await self.kube.list_pods(self.settings.namespace, self._role(role).selector)
        return [p for p in listing.pods if p.serving]

    def _worker(self, pod: PodInfo, role: PlannerRole) -> WorkerInfo:
        # The pod's name, not its IP, is the id: a reused IP must not inherit an identity.
        return WorkerInfo(pod.name, f"http://{pod.pod_ip}:{self.settings.engine_port}", role)

    # -- the Connector protocol

    async def workers(self, role: PlannerRole) -> list[WorkerInfo]:
        return [self._worker(p, role) for p in await self.serving_pods(role)]

    async def set_replicas(self, role: PlannerRole, n: int) -> None:
        spec = self._role(role)
        current = await self.kube.get_scale(self.settings.namespace, spec.target)
        if n >= current:
            if n > current:
                await self.kube.set_scale(self.settings.namespace, spec.target, n)
                log.info("planner: %s scaled to %d", spec.target, n)
            await self._wait_ready(role, n)
            await self._register(role)
            return
        serving = len(await self.serving_pods(role))
        if current > serving:
            # Pods not Ready yet serve nothing and the controller removes them first: drop
            # those without draining.
            current = max(n, serving)
            await self.kube.set_scale(self.settings.namespace, spec.target, current)
        for _ in range(current - n):
            await self.stop_one(role)

    # -- scale-up

    async def _wait_ready(self, role: PlannerRole, n: int) -> None:
        deadline = self.clock.now() + self.settings.start_timeout_s
        while len(await self.serving_pods(role)) < n:
            if self.clock.now() >= deadline:
                raise TimeoutError(f"{self._role(role).target}: {n} Ready pods not there in time")
            await asyncio.sleep(self.settings.poll_s)

    async def _register(self, role: PlannerRole) -> None:
        if not self.settings.register:
            return
        known = {b.id for b in await self.proxy.backends()}
        backend_role = self.settings.backend_roles.get(role, Role(role.value))
        for pod in await self.serving_pods(role):
            if pod.name not in known:
                w = self._worker(pod, role)
                await self.proxy.add_backend(w.id, w.url, backend_role)
                log.info("planner: registered %s pod %s at %s", role, w.id, w.url)

    # -- scale-down

    async def stop_one(self, role: PlannerRole) -> DrainReport:
        spec = self._role(role)
        pods = await self.serving_pods(role)
        if not pods:
            raise RuntimeError(f"no serving {role} pod to remove")
        if spec.target.kind is ScaleKind.STATEFULSET:
            victim = highest_ordinal(pods)
        else:
            workers = [self._worker(p, role) for p in pods]
            chosen = choose_victim(workers, await live_tokens(self.proxy))
            victim = next(p for p in pods if p.name == chosen.id)
        # Drained first: a pod is only marked and scaled away with no request left on it.
        report = await drain(
            self.proxy, victim.name, self.settings.drain_deadline_s, self.clock,
            poll_s=self.settings.poll_s,
        )  # fmt: skip
        self.last_drains = [*self.last_drains[-9:], report]
        self.events.on_drain(role, report)
        drained_or_raise(report)
        ns = self.settings.namespace
        if spec.target.kind is ScaleKind.DEPLOYMENT:
            await self.kube.annotate_pod(
                ns, victim.name, {DELETION_COST: str(LOWEST_DELETION_COST)}
            )
        replicas = await self.kube.get_scale(ns, spec.target)
        await self.kube.set_scale(ns, spec.target, replicas - 1)
        await self._wait_gone(role, victim.name)
        log.info("planner: drained and removed %s pod %s", role, victim.name)
        return report

    async def _wait_gone(self, role: PlannerRole, name: str) -> None:
        deadline = self.clock.now() + self.settings.stop_timeout_s
        selector = self._role(role).selector
        while any(
            p.name == name
            for p in (await self.kube.list_pods(self.settings.namespace, selector)).pods
        ):
            if self.clock.now() >= deadline:
                raise TimeoutError(f"pod {name} still there after it was scaled away")
            await asyncio.sleep(self.settings.poll_s)
