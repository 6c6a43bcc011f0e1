"""The thin loop around discovery's pure reconcile (fleet/discovery.py): it takes a source's
desired sets as they come and applies each one's plan through `FleetChanges`, the path admin
writes take.

Why through `FleetChanges`, and in one process: with `--workers N` every worker must hold the
same backends with the same shared load slots, and slots are handed out in the order changes
are applied. So discovery runs in worker 0 only and its changes go through the shared change
log like the admin API's; the other workers apply them in log order. Every worker watching on
its own would apply the same pod changes at different moments and hand out different slots.

A backend leaves in steps, nothing aborted: drained (no new requests, in every worker), its
movable live requests moved elsewhere (proxy/control/operations.py `evacuate_backend`, what
POST /admin/backends/{id}/evacuate does), then removed once no worker has a request on it or
`discovery_drain_timeout` has passed (a removed backend still finishes what it was sent). A
replacement under the same id (a new pod uid or IP) is added once the old one is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator

from fleet.changes import FleetChanges
from fleet.discovery import Desired, DiscoverySource, Plan, reconcile
from fleet.pod_backends import KubernetesSource
from fleet.registry import DuplicateBackend
from fleet.types import Backend
from proxy.control.operations import evacuate_backend
from proxy.ports import ControlServices

log = logging.getLogger("fleet_proxy.discovery")

POLL_S = 0.05  # how often a leaving backend's requests are counted


class DiscoveryLoop:
    def __init__(
        self,
        core: ControlServices,
        changes: FleetChanges,
        source: DiscoverySource,
        drain_timeout: float,
    ) -> None:
        self.core = core
        self.changes = changes
        self.source = source
        self.drain_timeout = drain_timeout
        self._desired: Desired | None = None  # None: the source has published nothing yet
        self._wake = asyncio.Event()
        self._leaving: dict[str, asyncio.Task[None]] = {}
        self._warned: set[str] = set()

    def publish(self, desired: Desired) -> None:
        self._desired = dict(desired)
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled; a source's end (the static one publishes once) ends nothing."""
        source = asyncio.create_task(self.source.run(self.publish), name="discovery-source")
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self.step()
        finally:
            for task in [source, *self._leaving.values()]:
                task.cancel()
            for task in [source, *self._leaving.values()]:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def step(self) -> Plan:
        """Reconcile the latest desired set with the registry and start what it plans."""
        if self._desired is None:
            return Plan()
        specs = [b.spec for b in self.core.fleet]
        plan = reconcile(self.source.name, specs, self._desired, self._leaving.keys())
        for backend_id in plan.conflicts:
            if backend_id not in self._warned:
                self._warned.add(backend_id)
                log.warning("discovered backend %s: the id is taken by another source", backend_id)
        for spec in plan.add:
            try:
                await self.changes.add(spec)
            except DuplicateBackend:  # added by the admin API since the reconcile
                log.warning("discovered backend %s: the id is taken", spec.id)
            else:
                log.info("discovered backend %s at %s", spec.id, spec.url)
        for spec in plan.update:
            await self.changes.update(spec)
        for backend_id in plan.remove:
            backend = self.core.fleet.get(backend_id)
            if backend is not None:
                self._leaving[backend_id] = asyncio.create_task(
                    self._remove(backend), name=f"discovery-remove-{backend_id}"
                )
        return plan

    def leaving(self) -> list[str]:
        """Ids of the backends on their way out."""
        return sorted(self._leaving)

    async def _remove(self, backend: Backend) -> None:
        try:
            result = await evacuate_backend(
                self.core, self.changes, backend, drain=True, reason="discovery"
            )
            log.info("discovered backend %s is gone; moved %s", backend.id, result["outcomes"])
            load = backend.load
            for _ in range(math.ceil(self.drain_timeout / POLL_S)):
                if load.in_flight + load.peer_in_flight == 0:
                    break
                await asyncio.sleep(POLL_S)
            if self.core.fleet.get(backend.id) is backend:  # not removed by hand meanwhile
                await self.changes.remove(backend.id)
        except Exception:  # one backend's removal must not end discovery
            log.exception("removing discovered backend %s failed", backend.id)
        finally:
            del self._leaving[backend.id]
            self._wake.set()  # a replacement under the same id may be waiting


@contextlib.asynccontextmanager
async def kubernetes_discovery(
    core: ControlServices, changes: FleetChanges
) -> AsyncIterator[DiscoveryLoop]:
    """The pod discovery the settings describe, its API client open for as long as this is.
    A kubeconfig that cannot be loaded raises here, at start-up."""
    # Here, not at the top: only a proxy that discovers pods loads the Kubernetes client.
    from fleet.kube_client import in_cluster_namespace, kube_api

    s = core.settings
    if s.discovery_kubeconfig is not None and not s.discovery_kubeconfig.is_file():
        # Else the client's own complaint names a missing key, not the missing file.
        raise ValueError(f"discovery_kubeconfig {s.discovery_kubeconfig}: no such file")
    namespace = s.discovery_namespace or in_cluster_namespace() or "default"
    async with kube_api(kubeconfig=s.discovery_kubeconfig) as api:
        source = KubernetesSource(api, namespace, s.discovery_label_selector, s.discovery_port)
        yield DiscoveryLoop(core, changes, source, s.discovery_drain_timeout)
