"""The InferenceObjectives of one InferencePool (the Gateway API Inference Extension's
`inference.networking.x-k8s.io/v1alpha2` resource), kept as objective name -> priority.

A request names its objective by the InferenceObjective's `metadata.name`; the objective's
`spec.priority` is an integer, unset meaning 0, negative allowed. An objective belongs to the
pool its `spec.poolRef.name` names (the pool in its own namespace); a `spec.poolRefs` list is
read the same way. Pure: fed the listed items and the watch's events."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GROUP = "inference.networking.x-k8s.io"
VERSION = "v1alpha2"
PLURAL = "inferenceobjectives"


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _pools(spec: Mapping[str, Any]) -> set[str]:
    refs = [spec.get("poolRef"), *(spec.get("poolRefs") or [])]
    return {str(r["name"]) for r in refs if isinstance(r, Mapping) and "name" in r}


class ObjectiveBook:
    """Objective name -> priority for the objectives that reference `pool`."""

    __slots__ = ("_pool", "_priorities")

    def __init__(self, pool: str) -> None:
        self._pool = pool
        self._priorities: dict[str, int] = {}

    def priority(self, objective: str) -> int | None:
        return self._priorities.get(objective)

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Everything the API lists now (after a list, or a watch started again)."""
        self._priorities.clear()
        for obj in items:
            self.apply("ADDED", obj)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        name = _name(obj)
        spec = obj.get("spec") or {}
        if kind == "DELETED" or self._pool not in _pools(spec):
            # Deleted, or moved to another pool.
            self._priorities.pop(name, None)
            return
        priority = spec.get("priority")
        self._priorities[name] = int(priority) if isinstance(priority, int) else 0

    def __len__(self) -> int:
        return len(self._priorities)
