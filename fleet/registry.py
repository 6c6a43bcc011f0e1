"""Fleet membership and the latest state of every backend.

The registry is the one owner of `Backend` objects. The proxy dispatches through them, the
scraper writes their snapshots, the owner of backend health (proxy/backends/health.py) their
health and ejections, the admin API adds, removes and drains them.
A removed backend keeps serving the requests already sent to it (they hold a reference);
it only stops receiving new ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Protocol
from urllib.parse import urlsplit

from fleet.types import FRESH, STALE, Backend, BackendSpec


def default_backend_id(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


class DuplicateBackend(ValueError):
    pass


class ModelsLearned(Protocol):
    """Told each time a backend's served models are learned from it: when it joins (found by
    discovery, added by the admin API, configured), when it comes back healthy (an engine
    restarted), and at every later /v1/models poll."""

    def models_learned(self, backend: Backend) -> None: ...


class FleetRegistry:
    def __init__(self, stale_after: float) -> None:
        self._backends: dict[str, Backend] = {}
        self.stale_after = stale_after
        self._removed_listeners: list[Callable[[str], None]] = []
        self._models_listeners: list[ModelsLearned] = []
        self._adapter_names: frozenset[str] = frozenset()  # over every backend

    def __iter__(self) -> Iterator[Backend]:
        return iter(list(self._backends.values()))

    def __len__(self) -> int:
        return len(self._backends)

    def get(self, backend_id: str) -> Backend | None:
        return self._backends.get(backend_id)

    def add(self, spec: BackendSpec, *, unchecked: bool = False) -> Backend:
        """`unchecked`: the backend starts out of routing, until its first passing health
        check (one added while the proxy runs); otherwise it is presumed healthy."""
        if spec.id in self._backends:
            raise DuplicateBackend(f"backend {spec.id!r} is already registered")
        backend = Backend(spec=spec, healthy=not unchecked)
        self._backends[spec.id] = backend
        return backend

    def remove(self, backend_id: str) -> Backend | None:
        backend = self._backends.pop(backend_id, None)
        if backend is not None:
            if backend.adapters:
                self._adapters_changed()
            for listener in self._removed_listeners:
                listener(backend_id)
        return backend

    def update(self, spec: BackendSpec) -> Backend | None:
        """Replace the spec of the backend with `spec.id`, keeping its state (load, scrapes,
        health); models learned from the backend are kept when `spec` names none."""
        backend = self._backends.get(spec.id)
        if backend is not None:
            backend.spec = spec if spec.models else replace(spec, models=backend.spec.models)
        return backend

    def on_removed(self, listener: Callable[[str], None]) -> None:
        self._removed_listeners.append(listener)

    def on_models_learned(self, listener: ModelsLearned) -> None:
        self._models_listeners.append(listener)

    def models_learned(
        self, backend: Backend, models: tuple[str, ...], adapters: frozenset[str] = frozenset()
    ) -> None:
        """What the backend's own /v1/models lists now: set, and told to the listeners."""
        self.set_models(backend, models, adapters)
        for listener in self._models_listeners:
            listener.models_learned(backend)

    def set_draining(self, backend_id: str, draining: bool) -> Backend | None:
        backend = self._backends.get(backend_id)
        if backend is not None:
            backend.draining = draining
        return backend

    def set_models(
        self, backend: Backend, models: tuple[str, ...], adapters: frozenset[str] = frozenset()
    ) -> None:
        """What the backend's /v1/models lists; `adapters`: those of them that are LoRA
        adapters."""
        if backend.spec.models != models:
            backend.spec = replace(backend.spec, models=models)
        if backend.adapters != adapters:
            backend.adapters = adapters
            self._adapters_changed()

    def is_adapter(self, model: str) -> bool:
        """Whether some backend serves `model` as a LoRA adapter."""
        return model in self._adapter_names

    def _adapters_changed(self) -> None:
        names: set[str] = set()
        for b in self._backends.values():
            names |= b.adapters
        self._adapter_names = frozenset(names)

    def candidates(self, model: str, now: float) -> list[Backend]:
        """Backends that may take a new request for `model` right now.

        Healthy, not draining, not ejected, serving `model`, with a fresh scrape. When every
        such backend's scrape is stale at once, the likely cause is this process (a saturated
        event loop delays all scrapes alike), not the fleet: then the healthy ones are used as
        they are, rather than answering 503 to everyone. A dead backend fails its health check
        or its connection and is excluded either way.
        """
        fresh: list[Backend] = []
        stale: list[Backend] = []
        stale_after = self.stale_after
        # A copy made in one step: the /metrics collectors call this from a scrape thread, where
        # a backend added or removed on the loop meanwhile would break iterating the dict itself.
        for b in tuple(self._backends.values()):
            # A backend whose models are not known yet serves nothing: no routing by model.
            if model not in b.spec.models:
                continue
            state = b.readiness(now, stale_after)
            if state == FRESH:
                fresh.append(b)
            elif state == STALE:
                stale.append(b)
        return fresh or stale

    def routable(self, now: float) -> list[Backend]:
        return [b for b in tuple(self._backends.values()) if b.routable(now, self.stale_after)]

    def models(self, now: float) -> list[str]:
        """Union of models over backends that can take requests."""
        seen: dict[str, None] = {}
        for b in self.routable(now):
            for m in b.spec.models:
                seen[m] = None
        return list(seen)

    def knows_model(self, model: str) -> bool:
        return any(model in b.spec.models for b in tuple(self._backends.values()))
