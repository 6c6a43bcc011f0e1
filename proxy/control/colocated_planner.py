"""The autoscaling planner run inside `fleet-proxy serve` (`planner_enabled`), and the admin it
drives: `ColocatedPlanner`, the planner loop with its connector, and `InProcessAdmin`, its
`ProxyAdmin` (planner/proxy_admin.py) on this proxy's own registry and live-request table,
changing the fleet through proxy/control/operations.py, as the admin API does (no HTTP to
itself, no admin token). `fleet-proxy plan` runs the same planner beside a proxy instead,
through its admin API (`HttpProxyAdmin`).

Its workers are local processes (planner/local.py), or the pods of a Deployment or StatefulSet
per role (`planner_environment: kubernetes`, planner/kubernetes.py); either outlives the proxy
on purpose: a restarted proxy finds local workers again through `planner_state_file`.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from fleet.changes import FleetChanges
from fleet.types import BackendSpec, Role
from planner.assemble import Planner, build_planner, local_settings, observers
from planner.config import PlannerRole
from planner.config_file import load_config
from planner.connectors import Environment, KubernetesOptions, build_connector, kubernetes_settings
from planner.proxy_admin import BackendStatus, LiveRequest
from planner.sla_mode import decider_for
from proxy.control import operations
from proxy.ports import ControlServices

log = logging.getLogger("fleet_proxy.planner")


class InProcessAdmin:
    """The planner's `ProxyAdmin` inside the proxy: a missing backend is a KeyError
    (`NoBackend`), where `HttpProxyAdmin` sees a 404."""

    def __init__(self, core: ControlServices, changes: FleetChanges) -> None:
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
            LiveRequest(e.backend_id, e.charged_prompt_tokens, e.tokens_generated)
            for e in self.core.live
        ]

    async def add_backend(self, backend_id: str, url: str, role: Role) -> None:
        await operations.add_backend(self.changes, BackendSpec(id=backend_id, url=url, role=role))

    async def drain(self, backend_id: str) -> None:
        await operations.set_draining(self.changes, backend_id, True)

    async def undrain(self, backend_id: str) -> None:
        await operations.set_draining(self.changes, backend_id, False)

    async def evacuate(self, backend_id: str) -> dict[str, int]:
        backend = operations.known_backend(self.core.fleet, backend_id)
        result = await operations.evacuate_backend(self.core, self.changes, backend)
        return dict(result["outcomes"])

    async def remove_backend(self, backend_id: str) -> None:
        await operations.remove_backend(self.changes, backend_id)  # already gone is what was wanted


def _by_role(prefill: str | None, decode: str | None) -> dict[PlannerRole, str]:
    """The roles given a value."""
    pairs = ((PlannerRole.PREFILL, prefill), (PlannerRole.DECODE, decode))
    return {role: value for role, value in pairs if value}


def _setting_names(fault: ValueError) -> str:
    """The fault as it names `fleet-proxy plan`'s flags, with this proxy's setting names."""
    return re.sub(r"--([a-z-]+)", lambda m: "planner_" + m[1].replace("-", "_"), str(fault))


class ColocatedPlanner:
    """The planner inside the proxy. Settings are checked when it is made (a fault stops
    start-up); the connector opens in `run` (a Kubernetes client lives as long as the loop),
    so `status()` says `running: false` until the first state exists."""

    def __init__(self, core: ControlServices, changes: FleetChanges) -> None:
        """ValueError naming what is wrong with the planner's settings or their file."""
        s = core.settings
        try:
            self.config = load_config(s.planner_config)
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"planner_config: {e}") from None
        decider_for(self.config)  # an SLA profile's or predictor's faults, now
        self.local = local_settings(
            self.config,
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
        self.environment = Environment(s.planner_environment)
        self.kubernetes = KubernetesOptions(
            namespace=s.planner_namespace,
            served_model_name=s.planner_served_model_name,
            targets=_by_role(s.planner_prefill_target, s.planner_decode_target),
            selectors=_by_role(s.planner_prefill_selector, s.planner_decode_selector),
            engine_port=s.planner_engine_port,
            kubeconfig=s.planner_kubeconfig,
            register=s.planner_register,
            start_timeout_s=s.planner_start_timeout,
            drain_deadline_s=s.planner_drain_deadline,
        )
        if self.environment is Environment.KUBERNETES:
            try:  # targets and selectors, before start-up goes on
                kubernetes_settings(self.kubernetes, self.config)
            except ValueError as e:
                raise ValueError(f"planner_environment kubernetes: {_setting_names(e)}") from None
        self.admin = InProcessAdmin(core, changes)
        self.observers = observers(core.prom, s.planner_log_dir)
        self.planner: Planner | None = None

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Planner]:
        """The planner with its connector open."""
        async with build_connector(
            self.environment, self.admin, self.config,
            local=self.local, kubernetes=self.kubernetes, events=self.observers.for_connector,
        ) as connector:  # fmt: skip
            self.planner = build_planner(self.admin, connector, self.config, self.observers)
            yield self.planner

    async def run(self) -> None:
        """Until cancelled; should it fail, the proxy serves on without it (logged)."""
        try:
            async with self.opened() as planner:
                await planner.loop.run()
        except Exception:
            log.exception("the planner stopped")

    def status(self) -> dict[str, Any]:
        if self.planner is None or self.planner.loop.state is None:
            return {"running": False, "environment": self.environment.value}
        return {"running": True, "environment": self.environment.value, **self.planner.status()}

    def close(self) -> None:
        """TensorBoard files flushed. Workers stay up: a restarted proxy finds them in the
        state file (local) or as the pods they are (Kubernetes)."""
        self.observers.close()
