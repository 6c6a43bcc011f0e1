"""An in-memory `KubeApi` that also plays the controllers: setting a Deployment's replicas
adds pods (Ready at once, or after `ready_after_polls` listings) or removes the pod of lowest
`pod-deletion-cost`; a StatefulSet's removes its highest ordinal. Watches replay scripted
streams. Every mutating call is logged in order."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace

from fleet.kube import (
    DELETION_COST,
    PodInfo,
    PodList,
    ScaleKind,
    ScaleTarget,
    WatchEvent,
)

Script = list[WatchEvent | Exception]


def ready_pod(name: str, ip: str, **changes: object) -> PodInfo:
    """A Ready, running pod in namespace `ns`; `changes` replace fields."""
    return replace(PodInfo(name, "ns", pod_ip=ip, ready=True, phase="Running"), **changes)


@dataclass
class FakeKube:
    replicas: dict[str, int] = field(default_factory=dict)  # str(target) -> replicas
    pods: dict[str, PodInfo] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    ready_after_polls: int = 0
    watch_scripts: list[Script] = field(default_factory=list)  # one per watch call, in order
    watch_calls: list[str] = field(default_factory=list)  # the resourceVersion of each
    version: int = 100
    _made: int = 0
    _pending: dict[str, int] = field(default_factory=dict)  # pod -> listings until Ready

    async def get_scale(self, namespace: str, target: ScaleTarget) -> int:
        return self.replicas.get(str(target), 0)

    async def set_scale(self, namespace: str, target: ScaleTarget, replicas: int) -> None:
        self.calls.append(("scale", f"{target}={replicas}"))
        self.replicas[str(target)] = replicas
        prefix = target.name + "-"
        mine = sorted((p for p in self.pods.values() if p.name.startswith(prefix)),
                      key=lambda p: int(p.name.rsplit("-", 1)[1]))  # fmt: skip
        while len(mine) < replicas:
            ordinal = len(mine) if target.kind is ScaleKind.STATEFULSET else self._made
            self._made += 1
            pod = ready_pod(f"{prefix}{ordinal}", f"10.0.0.{self._made}")
            if self.ready_after_polls:
                pod = replace(pod, ready=False)
                self._pending[pod.name] = self.ready_after_polls
            self.pods[pod.name] = pod
            mine.append(pod)
        while len(mine) > replicas:
            if target.kind is ScaleKind.STATEFULSET:
                victim = mine[-1]
            else:
                victim = min(mine, key=lambda p: int(p.annotations.get(DELETION_COST, "0")))
            mine.remove(victim)
            del self.pods[victim.name]

    async def list_pods(self, namespace: str, selector: str) -> PodList:
        for name in list(self._pending):
            self._pending[name] -= 1
            if self._pending[name] <= 0:
                del self._pending[name]
                self.pods[name] = replace(self.pods[name], ready=True)
        self.version += 1
        return PodList(list(self.pods.values()), str(self.version))

    async def watch_pods(
        self, namespace: str, selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        self.watch_calls.append(resource_version)
        script = self.watch_scripts.pop(0) if self.watch_scripts else []
        for item in script:
            if isinstance(item, Exception):
                raise item
            yield item

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self.calls.append(("annotate", name))
        pod = self.pods[name]
        self.pods[name] = replace(pod, annotations={**pod.annotations, **annotations})

    async def delete_pod(self, namespace: str, name: str) -> None:
        self.calls.append(("delete", name))
        self.pods.pop(name, None)
