"""The InferencePool an endpoint picker serves, followed: its engines are the pods of the
pool's selector on its target port (pod discovery, proxy/control/discovery_loop.py), and when
the pool's selector or port changes, discovery starts again on the new ones; pods that no
longer belong leave as gone pods do (drained, then removed).

The pool is read (a GET: `get` on the one pool is all it needs), then watched
(fleet/kube_resources.py); where the watch cannot be had (RBAC without `watch`, an API that
breaks it) it is read again every `interval_s`, as a poll. A pool that is deleted, or changed
to name no selector or port, leaves the last good one in force (logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from fleet.changes import FleetChanges
from fleet.inference_pool import GROUP, PLURAL, VERSION, PoolTarget, pool_target
from fleet.kube_client import KubernetesAsyncApi
from fleet.kube_resources import ResourceEvent, ResourceKind, follow_resources
from fleet.pod_backends import KubernetesSource
from proxy.control.discovery_loop import DiscoveryLoop
from proxy.ports import ControlServices

log = logging.getLogger("fleet_proxy.discovery")

POOLS = ResourceKind(GROUP, VERSION, PLURAL)


class PoolTargets:
    """The named pool's target, from the pools listed and watched; `changed` is set when it
    moved."""

    def __init__(self, namespace: str, name: str, target: PoolTarget) -> None:
        self._where = f"InferencePool {namespace}/{name}"
        self._name = name
        self.target = target
        self.changed = asyncio.Event()

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        mine = [p for p in items if (p.get("metadata") or {}).get("name") == self._name]
        if not mine:
            log.warning("%s is not listed; keeping %s", self._where, self.target)
            return
        self.apply("MODIFIED", mine[0])

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != self._name:
            return
        if kind == "DELETED":
            log.warning("%s was deleted; keeping %s", self._where, self.target)
            return
        try:
            now = pool_target(obj)
        except ValueError as e:
            log.warning("%s: %s; keeping %s", self._where, e, self.target)
            return
        if now != self.target:
            log.info("%s now selects %s on port %d", self._where, now.selector, now.port)
            self.target = now
            self.changed.set()


class NamedPool:
    """The pools API seen through one pool: "listing" is reading that pool."""

    def __init__(self, api: KubernetesAsyncApi, name: str) -> None:
        self._api = api
        self._name = name

    async def list_custom_objects(
        self, group: str, version: str, namespace: str, plural: str
    ) -> tuple[list[dict[str, Any]], str]:
        pool = await self._api.get_custom_object(group, version, namespace, plural, self._name)
        return [pool], str((pool.get("metadata") or {}).get("resourceVersion", ""))

    def watch_custom_objects(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        resource_version: str,
        timeout_s: int,
    ) -> AsyncIterator[ResourceEvent]:
        return self._api.watch_custom_objects(
            group, version, namespace, plural, resource_version, timeout_s
        )


class PoolFollower:
    def __init__(
        self,
        api: KubernetesAsyncApi,
        namespace: str,
        name: str,
        core: ControlServices,
        changes: FleetChanges,
        interval_s: float,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self._core = core
        self._changes = changes
        self._interval_s = interval_s

    async def read(self) -> PoolTarget:
        """The pool's pods and port now; ValueError for a pool that names neither, the API's
        error for one that cannot be read."""
        pool = await self._api.get_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        return pool_target(pool)

    async def run(self, target: PoolTarget) -> None:
        """Discovery of `target`'s pods, restarted on the pool's changes; until cancelled."""
        targets = PoolTargets(self.namespace, self.name, target)
        follow = asyncio.create_task(
            follow_resources(
                NamedPool(self._api, self.name), POOLS, self.namespace, targets, self._interval_s
            ),
            name=f"pool-{self.name}",
        )
        task = self._discover(target)
        try:
            while True:
                await targets.changed.wait()
                targets.changed.clear()
                await _cancelled(task)
                task = self._discover(targets.target)
        finally:
            await _cancelled(task)
            await _cancelled(follow)

    def _discover(self, target: PoolTarget) -> asyncio.Task[None]:
        source = KubernetesSource(self._api, self.namespace, target.selector, target.port)
        drain = self._core.settings.discovery_drain_timeout
        loop = DiscoveryLoop(self._core, self._changes, source, drain)
        return asyncio.create_task(loop.run(), name=f"discovery-{self.name}")


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
