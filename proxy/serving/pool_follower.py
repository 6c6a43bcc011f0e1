"""The InferencePool an endpoint picker serves, followed: its engines are the pods of the
pool's selector on its target port (pod discovery, proxy/control/discovery_loop.py), and when
the pool's selector or port changes, discovery starts again on the new ones; pods that no
longer belong leave as gone pods do (drained, then removed).

The pool is read again every `interval_s`: a change to a pool is rare, and a read is one GET.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fleet.changes import FleetChanges
from fleet.inference_pool import GROUP, PLURAL, VERSION, PoolTarget, pool_target
from fleet.kube_client import KubernetesAsyncApi
from fleet.pod_backends import KubernetesSource
from proxy.control.discovery_loop import DiscoveryLoop
from proxy.ports import ControlServices

log = logging.getLogger("fleet_proxy.discovery")


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
        task = self._discover(target)
        try:
            while True:
                await asyncio.sleep(self._interval_s)
                try:
                    now = await self.read()
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # the last good target stays in force
                    log.warning("InferencePool %s/%s: %s", self.namespace, self.name, e)
                    continue
                if now != target:
                    log.info(
                        "InferencePool %s/%s now selects %s on port %d",
                        self.namespace,
                        self.name,
                        now.selector,
                        now.port,
                    )
                    await _cancelled(task)
                    target = now
                    task = self._discover(target)
        finally:
            await _cancelled(task)

    def _discover(self, target: PoolTarget) -> asyncio.Task[None]:
        source = KubernetesSource(self._api, self.namespace, target.selector, target.port)
        drain = self._core.settings.discovery_drain_timeout
        loop = DiscoveryLoop(self._core, self._changes, source, drain)
        return asyncio.create_task(loop.run(), name=f"discovery-{self.name}")


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
