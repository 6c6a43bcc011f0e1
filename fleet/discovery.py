"""Where backends come from: sources that each publish the backends they want, and the pure
reconcile that turns one source's wanted set into registry changes.

A `DiscoverySource` publishes its whole desired set each time it changes: the static list from
the settings once (`StaticSource`), the Ready pods behind a label selector on every pod change
(`KubernetesSource`, fleet/pod_backends.py). The admin API is a source too, one backend at a
time: what it adds carries `source="admin"`. Every backend carries its source in
`BackendSpec.source`, and `reconcile` compares a desired set only with the backends of that
same source, so one source never removes or changes another's backends.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from fleet.types import BackendSpec

Desired = Mapping[str, BackendSpec]  # the backends a source wants, by id
Publish = Callable[[Desired], None]

STATIC = "static"
ADMIN = "admin"
KUBERNETES = "kubernetes"


class DiscoverySource(Protocol):
    @property
    def name(self) -> str:
        """The `source` every spec it publishes carries."""
        ...

    async def run(self, publish: Publish) -> None:
        """Publish the desired set, then again after each change to it; returns once it can
        change no more, else runs until cancelled."""
        ...


class StaticSource:
    """The backends of the settings: one desired set, published once."""

    def __init__(self, specs: Iterable[BackendSpec]) -> None:
        self.desired: dict[str, BackendSpec] = {s.id: replace(s, source=STATIC) for s in specs}

    @property
    def name(self) -> str:
        return STATIC

    async def run(self, publish: Publish) -> None:
        publish(self.desired)


@dataclass(frozen=True, slots=True)
class Plan:
    """What to change so that a source's backends become its desired set.

    `remove` holds the ids to retire: no longer wanted, or wanted as another incarnation (a new
    URL or instance under the same id); such a replacement is in no list until the old backend
    is gone, then the next reconcile adds it. `update` changes a backend's spec in place (same
    URL and instance). `conflicts` are wanted ids that another source's backend holds: left
    alone."""

    add: tuple[BackendSpec, ...] = ()
    remove: tuple[str, ...] = ()
    update: tuple[BackendSpec, ...] = ()
    conflicts: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.add or self.remove or self.update)


def same_incarnation(a: BackendSpec, b: BackendSpec) -> bool:
    return a.url == b.url and a.instance == b.instance


def reconcile(
    source: str,
    current: Iterable[BackendSpec],
    desired: Desired,
    retiring: Collection[str] = (),
) -> Plan:
    """The changes that make `source`'s backends in `current` (the whole registry's specs)
    equal `desired`. `retiring`: ids of this source's backends already on their way out;
    nothing is planned for them until they are gone."""
    mine = {s.id: s for s in current if s.source == source}
    others = {s.id for s in current if s.source != source}
    add: list[BackendSpec] = []
    update: list[BackendSpec] = []
    remove: list[str] = []
    conflicts: list[str] = []
    # In the source's own order: the settings' list order is the fleet's order (listings,
    # round-robin, ties), so adds keep it.
    for backend_id in desired:
        if backend_id in retiring:
            continue
        want = replace(desired[backend_id], source=source)
        have = mine.get(backend_id)
        if have is None:
            if backend_id in others:
                conflicts.append(backend_id)
            else:
                add.append(want)
        elif not same_incarnation(have, want):
            remove.append(backend_id)
        elif _configured(have, want) != want:
            update.append(want)
    remove.extend(i for i in sorted(mine) if i not in desired and i not in retiring)
    return Plan(tuple(add), tuple(remove), tuple(update), tuple(conflicts))


def _configured(have: BackendSpec, want: BackendSpec) -> BackendSpec:
    """`have` as `want` would state it: models learned from the backend do not count as a
    change when the source names none."""
    return have if want.models else replace(have, models=())
