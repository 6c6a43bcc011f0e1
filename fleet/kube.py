"""Our view of the Kubernetes API: `KubeApi`, the calls the planner's Kubernetes connector and a
pod discovery make, with typed pods (`PodInfo`) and watch events (`WatchEvent`).

What it covers: the Scale subresource of a Deployment or StatefulSet (read, patch), pods by
label selector (list with the list's resourceVersion, watch from a resourceVersion with
bookmarks), a pod's annotations (patch) and deleting a pod. A watch whose resourceVersion is
too old ends with `Gone` (HTTP 410): the caller lists again. The implementation over
kubernetes-asyncio is `fleet/kube_client.py`; this module does no I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

# The ReplicaSet controller removes the pods of lowest deletion cost first on a scale-down.
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LOWEST_DELETION_COST = -2147483648  # the annotation's int32 minimum


class ScaleKind(StrEnum):
    DEPLOYMENT = "deployment"
    STATEFULSET = "statefulset"


@dataclass(frozen=True, slots=True)
class ScaleTarget:
    """What a role scales: `deployment/NAME` or `statefulset/NAME`."""

    kind: ScaleKind
    name: str

    @classmethod
    def parse(cls, text: str) -> ScaleTarget:
        kind, sep, name = text.partition("/")
        if not sep or not name or kind.lower() not in set(ScaleKind):
            raise ValueError(f"scale target {text!r}: deployment/NAME or statefulset/NAME expected")
        return cls(ScaleKind(kind.lower()), name)

    def __str__(self) -> str:
        return f"{self.kind.value}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodInfo:
    name: str
    namespace: str
    uid: str = ""  # differs between two pods of the same name (a StatefulSet's recreated pod)
    node_name: str = ""  # the node it was scheduled on
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    pod_ip: str | None = None
    ready: bool = False  # the Ready condition is True
    deletion_timestamp: datetime | None = None  # set: the pod is terminating
    phase: str = "Unknown"

    @property
    def serving(self) -> bool:
        """Ready, not terminating and with an address: it can take requests."""
        return self.ready and self.deletion_timestamp is None and bool(self.pod_ip)


def pod_from_json(obj: Mapping[str, Any]) -> PodInfo:
    """A `PodInfo` from a pod's JSON object as the API serves it."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    deleted = meta.get("deletionTimestamp")
    return PodInfo(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=str(meta.get("uid") or ""),
        node_name=str((obj.get("spec") or {}).get("nodeName") or ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        pod_ip=status.get("podIP") or None,
        ready=ready,
        deletion_timestamp=datetime.fromisoformat(deleted.replace("Z", "+00:00"))
        if deleted
        else None,
        phase=str(status.get("phase") or "Unknown"),
    )


@dataclass(frozen=True, slots=True)
class PodList:
    pods: list[PodInfo]
    resource_version: str  # watch from here to see every change after this list


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"  # no change: the resourceVersion moved on


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    resource_version: str
    pod: PodInfo | None = None  # None for a bookmark


class Gone(Exception):
    """HTTP 410: the resourceVersion is older than the server keeps; list again."""


def watch_line(raw: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    """(type, resourceVersion, object) of one line of any watch stream; an ERROR line raises
    `Gone` for code 410, else RuntimeError."""
    kind = str(raw.get("type", ""))
    obj = raw.get("object") or {}
    if kind == "ERROR":
        code = obj.get("code")
        if code == 410:
            raise Gone(str(obj.get("message", "resourceVersion too old")))
        raise RuntimeError(f"watch error {code}: {obj.get('message', obj)}")
    return kind, str((obj.get("metadata") or {}).get("resourceVersion", "")), obj


def watch_event(raw: Mapping[str, Any]) -> WatchEvent:
    """One line of a pod watch stream as a `WatchEvent` (see `watch_line`)."""
    kind, version, obj = watch_line(raw)
    etype = EventType(kind)
    pod = None if etype is EventType.BOOKMARK else pod_from_json(obj)
    return WatchEvent(etype, version, pod)


class KubeApi(Protocol):
    async def get_scale(self, namespace: str, target: ScaleTarget) -> int:
        """The target's desired replicas (spec.replicas of its Scale subresource)."""
        ...

    async def set_scale(self, namespace: str, target: ScaleTarget, replicas: int) -> None: ...

    async def list_pods(self, namespace: str, selector: str) -> PodList: ...

    def watch_pods(
        self, namespace: str, selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        """Changes after `resource_version`, bookmarks included, until the server ends the
        watch (about `timeout_s`); raises `Gone` when that version is too old."""
        ...

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge these annotations into the pod's."""
        ...

    async def delete_pod(self, namespace: str, name: str) -> None: ...
