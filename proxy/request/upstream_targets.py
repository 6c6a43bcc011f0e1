"""Where a leg's request goes: the origin and full path of an API path on a backend whose URL
may carry a path prefix, split once per backend URL."""

from __future__ import annotations

from fleet.registry import FleetRegistry
from fleet.types import Backend
from proxy.backends.upstream import split_url


class UpstreamTargets:
    __slots__ = ("_splits",)

    def __init__(self, fleet: FleetRegistry) -> None:
        self._splits: dict[str, tuple[str, str]] = {}  # backend URL -> (origin, path prefix)
        fleet.on_removed(lambda _: self._splits.clear())  # rebuilt as requests come

    def target(self, backend: Backend, path: str) -> tuple[str, str]:
        """The origin and full path of `path` on `backend`."""
        split = self._splits.get(backend.url)
        if split is None:
            split = self._splits[backend.url] = split_url(backend.url)
        origin, prefix = split
        return origin, prefix + path
