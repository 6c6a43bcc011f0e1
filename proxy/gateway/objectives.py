"""Where a request's objective gets its priority: the `--objective NAME=PRIORITY` flags, the
InferenceObjectives of the picker's InferencePool, or both (the flags first). A negative
priority makes the objective's requests sheddable (proxy/gateway/shedding.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class ObjectivePriorities(Protocol):
    def priority(self, objective: str) -> int | None:
        """The objective's priority, None when this source does not name it."""
        ...


class FixedPriorities:
    """Priorities given once, as the command line gives them."""

    __slots__ = ("_priorities",)

    def __init__(self, priorities: Mapping[str, int] | None = None) -> None:
        self._priorities = dict(priorities or {})

    def priority(self, objective: str) -> int | None:
        return self._priorities.get(objective)


class LayeredPriorities:
    """The first source that names an objective decides its priority."""

    __slots__ = ("_sources",)

    def __init__(self, *sources: ObjectivePriorities) -> None:
        self._sources = sources

    def priority(self, objective: str) -> int | None:
        for source in self._sources:
            found = source.priority(objective)
            if found is not None:
                return found
        return None
