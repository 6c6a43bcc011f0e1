"""The current set of pods behind a label selector, kept by list-then-watch.

The pure core: `PodSet` (the pods by name and the resourceVersion they are as of) with
`relisted` and `applied`, and `backoff_s`. The loop, `PodWatcher.run`, lists, watches from the
list's resourceVersion (bookmarks move it on without a change), watches again from the last
version when the server ends a watch, lists again after `Gone` (410: that version is too old),
and waits a bounded, doubling backoff after an error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from fleet.kube import EventType, Gone, KubeApi, PodInfo, PodList, WatchEvent

log = logging.getLogger("fleet_proxy.kube")

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PodSet:
    pods: Mapping[str, PodInfo] = field(default_factory=dict)
    resource_version: str = ""  # "": not listed yet, a list is due


def relisted(listing: PodList) -> PodSet:
    return PodSet({p.name: p for p in listing.pods}, listing.resource_version)


def applied(state: PodSet, event: WatchEvent) -> PodSet:
    """The set after one watch event; every event, a bookmark too, moves the version on."""
    pods = dict(state.pods)
    if event.pod is not None and event.type in (EventType.ADDED, EventType.MODIFIED):
        pods[event.pod.name] = event.pod
    elif event.pod is not None and event.type is EventType.DELETED:
        pods.pop(event.pod.name, None)
    return PodSet(pods, event.resource_version or state.resource_version)


def backoff_s(failures: int, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """The wait after `failures` consecutive failed attempts: doubling, at most `cap_s`."""
    if failures <= 0:
        return 0.0
    return float(min(cap_s, base_s * 2 ** (failures - 1)))


class PodWatcher:
    """Keeps `state` current for one namespace and selector; `on_change` after each change."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        selector: str,
        *,
        watch_timeout_s: int = 300,
        on_change: Callable[[PodSet], None] | None = None,
        sleep: Sleep = asyncio.sleep,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.selector = selector
        self.watch_timeout_s = watch_timeout_s
        self.on_change = on_change
        self.sleep = sleep
        self.max_backoff_s = max_backoff_s
        self.state = PodSet()
        self.lists = 0  # how many times it listed (a re-list after 410 counts)

    def _set(self, state: PodSet) -> None:
        changed = state.pods != self.state.pods
        self.state = state
        if changed and self.on_change is not None:
            self.on_change(state)

    async def run(self) -> None:
        """Until cancelled."""
        failures = 0
        while True:
            try:
                if not self.state.resource_version:
                    self.lists += 1
                    self._set(relisted(await self.kube.list_pods(self.namespace, self.selector)))
                events = 0
                async for event in self.kube.watch_pods(
                    self.namespace, self.selector, self.state.resource_version, self.watch_timeout_s
                ):
                    self._set(applied(self.state, event))
                    events += 1
                    failures = 0
                # The server ended the watch: go on from the last version seen; an empty one
                # counts as a failure so that a server closing at once is not hammered.
                if events == 0:
                    failures += 1
                    await self.sleep(backoff_s(failures, cap_s=self.max_backoff_s))
            except Gone:
                log.info("pod watch %s: resourceVersion too old, listing again", self.selector)
                self.state = PodSet(self.state.pods, "")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures += 1
                wait = backoff_s(failures, cap_s=self.max_backoff_s)
                log.warning("pod watch %s failed (%s); retrying in %.1fs", self.selector, e, wait)
                await self.sleep(wait)
