"""The planner inside `fleet-proxy serve` (`planner_enabled`): `InProcessAdmin`, the planner's
`ProxyAdmin` on this proxy's own registry and live-request table, changing the fleet through
the same code the admin API uses (no HTTP to itself), and `build_colocated_planner`.

Its workers are local processes (planner/local.py) that outlive the proxy on purpose: a
restarted proxy finds them again through `planner_state_file`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from fleet.types import BackendSpec, Role
from planner.admin import BackendStatus, LiveRequest
from planner.assemble import Planner, build_planner, local_settings, observers
from planner.config import PlannerRole
from planner.config_file import load_config
from planner.local import LocalConnector
from proxy.admin import evacuate_backend
from proxy.core import ProxyCore
from proxy.peer_sync import FleetChanges


class InProcessAdmin:
    def __init__(self, core: ProxyCore, changes: FleetChanges) -> None:
        self.core = core
        self.changes = changes

    async def backends(self) -> list[BackendStatus]:
        out: list[BackendStatus] = []
        for b in self.core.fleet:
            m = b.snapshot.metrics if b.snapshot is not None else None
            out.append(
                BackendStatus(
                    id=b.id,
                    url=b.url,
                    role=b.role,
                    draining=b.draining,
                    in_flight=b.load.in_flight,
                    waiting=m.waiting if m is not None else None,
                    kv_usage=m.kv_usage if m is not None else None,
                )
            )
        return out

    async def live_requests(self) -> list[LiveRequest]:
        return [
            LiveRequest(e.backend_id, e.prompt_tokens, e.tokens_generated) for e in self.core.live
        ]

    async def add_backend(self, backend_id: str, url: str, role: Role) -> None:
        await self.changes.add(BackendSpec(id=backend_id, url=url, role=role))

    async def drain(self, backend_id: str) -> None:
        await self._set_draining(backend_id, True)

    async def undrain(self, backend_id: str) -> None:
        await self._set_draining(backend_id, False)

    async def evacuate(self, backend_id: str) -> dict[str, int]:
        backend = self.core.fleet.get(backend_id)
        if backend is None:
            raise KeyError(f"no backend {backend_id!r}")
        result = await evacuate_backend(self.core, self.changes, backend)
        return dict(result["outcomes"])

    async def remove_backend(self, backend_id: str) -> None:
        await self.changes.remove(backend_id)  # already gone is what was wanted

    async def _set_draining(self, backend_id: str, draining: bool) -> None:
        if await self.changes.set_draining(backend_id, draining) is None:
            raise KeyError(f"no backend {backend_id!r}")


def build_colocated_planner(core: ProxyCore, changes: FleetChanges) -> Planner:
    """ValueError naming what is wrong with the planner's settings or their file."""
    s = core.settings
    try:
        config = load_config(s.planner_config)
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"planner_config: {e}") from None
    local = local_settings(
        config,
        commands={
            PlannerRole.PREFILL: s.planner_prefill_command,
            PlannerRole.DECODE: s.planner_decode_command,
        },
        gpus=s.planner_gpus,
        state_file=Path(s.planner_state_file),
        worker_log_dir=s.planner_worker_log_dir,
        start_timeout_s=s.planner_start_timeout,
        drain_deadline_s=s.planner_drain_deadline,
    )
    admin = InProcessAdmin(core, changes)
    watching = observers(core.prom, s.planner_log_dir)
    connector = LocalConnector(admin, local, events=watching.for_connector)
    return build_planner(admin, connector, config, watching)
