"""Which connector the planner drives: `build_connector(environment, ...)`, `local` (processes,
`LocalConnector`) or `kubernetes` (pods, `KubernetesConnector`), and the Kubernetes options as
the command line gives them (`KubernetesOptions`, `kubernetes_settings`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from fleet.kube import ScaleTarget
from fleet.types import Role
from planner.config import PlannerConfig, PlannerRole
from planner.connector import Connector
from planner.events import PlannerEvents
from planner.kubernetes import KubernetesConnector, KubernetesSettings, KubeRole, default_selector
from planner.local import LocalConnector, LocalSettings
from planner.proxy_admin import ProxyAdmin


class Environment(StrEnum):
    LOCAL = "local"
    KUBERNETES = "kubernetes"


@dataclass(frozen=True, slots=True)
class KubernetesOptions:
    namespace: str | None = None  # None: the in-cluster namespace, else `default`
    served_model_name: str | None = None  # names the default pod selectors
    targets: Mapping[PlannerRole, str] = field(default_factory=dict)  # deployment/NAME ...
    selectors: Mapping[PlannerRole, str] = field(default_factory=dict)
    engine_port: int = 8000
    kubeconfig: Path | None = None
    base_url: str | None = None  # an API server without credentials (tests, kubectl proxy)
    register: bool = True
    start_timeout_s: float = 600.0
    drain_deadline_s: float = 120.0


def backend_roles(config: PlannerConfig) -> dict[PlannerRole, Role]:
    """The role each planner role's workers register with: `both` in an aggregated fleet."""
    roles = {PlannerRole.PREFILL: Role.PREFILL, PlannerRole.DECODE: Role.DECODE}
    if len(config.roles) == 1:
        roles[PlannerRole.DECODE] = Role.BOTH
    return roles


def kubernetes_settings(options: KubernetesOptions, config: PlannerConfig) -> KubernetesSettings:
    """Every planned role needs a target, and a selector or a served model name."""
    # Here, not at the top: the Kubernetes client (kubernetes-asyncio, aiohttp) is loaded only
    # by a planner that drives pods.
    from fleet.kube_client import in_cluster_namespace

    roles: dict[PlannerRole, KubeRole] = {}
    for role in config.roles:
        target = options.targets.get(role)
        if not target:
            raise ValueError(f"--{role.value}-target is needed with --environment kubernetes")
        selector = options.selectors.get(role)
        if not selector:
            if not options.served_model_name:
                raise ValueError(f"--{role.value}-selector or --served-model-name is needed")
            selector = default_selector(options.served_model_name, role)
        roles[role] = KubeRole(ScaleTarget.parse(target), selector)
    return KubernetesSettings(
        namespace=options.namespace or in_cluster_namespace() or "default",
        roles=roles,
        engine_port=options.engine_port,
        register=options.register,
        backend_roles=backend_roles(config),
        start_timeout_s=options.start_timeout_s,
        drain_deadline_s=options.drain_deadline_s,
    )


@contextlib.asynccontextmanager
async def build_connector(
    environment: Environment,
    proxy: ProxyAdmin,
    config: PlannerConfig,
    *,
    local: LocalSettings | None = None,
    kubernetes: KubernetesOptions | None = None,
    events: PlannerEvents | None = None,
) -> AsyncIterator[Connector]:
    """The connector for `environment`, open for the duration of the block; it reports its
    drains to `events`."""
    if environment is Environment.LOCAL:
        yield LocalConnector(proxy, local or LocalSettings(), events=events)
        return
    from fleet.kube_client import kube_api

    options = kubernetes or KubernetesOptions()
    settings = kubernetes_settings(options, config)
    async with kube_api(kubeconfig=options.kubeconfig, base_url=options.base_url) as kube:
        yield KubernetesConnector(proxy, kube, settings, events=events)
