"""`fleet-proxy epp`: the endpoint picker's gRPC server over the proxy's own fleet state.

The fleet, its scraper and health checks, the policy and the metrics are the proxy's
(`ProxyCore`); only the data plane is Envoy's. grpc is imported here, never by `serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from fleet.changes import LocalChanges
from fleet.inference_objectives import GROUP as OBJECTIVE_GROUP
from fleet.inference_objectives import PLURAL as OBJECTIVE_PLURAL
from fleet.inference_objectives import VERSION as OBJECTIVE_VERSION
from fleet.inference_objectives import ObjectiveBook
from fleet.kube_resources import ResourceKind, follow_resources
from proxy.control.discovery_loop import kubernetes_discovery
from proxy.gateway.ext_proc import ExternalProcessor
from proxy.gateway.objectives import LayeredPriorities
from proxy.gateway.options import EppOptions
from proxy.gateway.picking import EndpointPicker
from proxy.gateway.usage import UsageMetrics
from proxy.serving.wiring import ProxyCore
from proxy.settings import Settings

if TYPE_CHECKING:
    from fleet.kube_client import KubernetesAsyncApi
    from proxy.serving.pool_follower import PoolFollower

OBJECTIVES = ResourceKind(OBJECTIVE_GROUP, OBJECTIVE_VERSION, OBJECTIVE_PLURAL)

log = logging.getLogger("fleet_proxy.gateway")

# Seconds a stop gives the streams in progress (requests the gateway is forwarding) to end.
STOP_GRACE_S = 5.0
# The Endpoint Picker Protocol's health services: the process answers, and it can pick.
LIVENESS = "liveness"
READINESS_SERVICES = ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "")
READINESS_EVERY_S = 0.5


@dataclass(frozen=True, slots=True)
class RunningEpp:
    port: int
    core: ProxyCore


@contextlib.asynccontextmanager
async def running_epp(settings: Settings, options: EppOptions) -> AsyncIterator[RunningEpp]:
    """The picker listening on `options.port` (0: a free one), its fleet scraped; with pod
    discovery (`discovery_kubernetes`, or an InferencePool), its engines found as pods."""
    core = ProxyCore(settings)
    async with contextlib.AsyncExitStack() as stack:
        # First: a Kubernetes client that cannot be configured, or a pool that cannot be read,
        # stops start-up at once.
        discover: Callable[[], Coroutine[Any, Any, None]] | None = None
        objectives: Callable[[], Coroutine[Any, Any, None]] | None = None
        shedding = options.shedding
        if options.pool_name is not None:
            follower, api = await _pool_follower(stack, core, options.pool_name, options)
            # The pool's InferenceObjectives give priorities the flags do not.
            book = ObjectiveBook(options.pool_name)
            shedding = replace(shedding, priorities=LayeredPriorities(shedding.priorities, book))
            objectives = partial(
                follow_resources, api, OBJECTIVES, follower.namespace, book, options.pool_poll_s
            )
            target = await follower.read()
            log.info(
                "InferencePool %s/%s: pods %s, port %d",
                follower.namespace,
                follower.name,
                target.selector,
                target.port,
            )
            discover = partial(follower.run, target)
        elif settings.discovery_kubernetes:
            loop = await stack.enter_async_context(
                kubernetes_discovery(core, LocalChanges(core.fleet))
            )
            discover = loop.run
        await core.start()
        stack.push_async_callback(core.stop)
        if discover is not None:
            task = asyncio.create_task(discover(), name="discovery")
            stack.push_async_callback(_cancelled, task)
        if objectives is not None:
            task = asyncio.create_task(objectives(), name="objectives")
            stack.push_async_callback(_cancelled, task)
        server: Any = aio.server()
        health: Any = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessor(
                EndpointPicker(core, options.fallbacks, shedding),
                core.metrics,
                UsageMetrics(core.prom),
            ),
            server,
        )
        try:
            port = server.add_insecure_port(f"{options.host}:{options.port}")
        except RuntimeError:  # grpc's word for a port it cannot bind
            port = 0
        if port == 0:
            raise OSError(f"cannot listen on {options.host}:{options.port}")
        await server.start()
        stack.push_async_callback(server.stop, STOP_GRACE_S)
        await health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        stack.push_async_callback(health.enter_graceful_shutdown)
        watch = asyncio.create_task(_readiness(core, health), name="epp-readiness")
        stack.push_async_callback(_cancelled, watch)
        if options.metrics_port is not None:
            from prometheus_client import start_http_server

            metrics_server, _ = start_http_server(
                options.metrics_port, options.host, registry=core.prom
            )
            stack.callback(metrics_server.server_close)
            stack.callback(metrics_server.shutdown)
        yield RunningEpp(port, core)


async def _pool_follower(
    stack: contextlib.AsyncExitStack[Any], core: ProxyCore, name: str, options: EppOptions
) -> tuple[PoolFollower, KubernetesAsyncApi]:
    """The follower of the InferencePool `name`, and its API client, open for as long as
    `stack`."""
    # Here, not at the top: only a picker of an InferencePool loads the Kubernetes client.
    from fleet.kube_client import in_cluster_namespace, kube_api
    from proxy.serving.pool_follower import PoolFollower

    settings = core.settings
    namespace = (
        options.pool_namespace
        or settings.discovery_namespace
        or in_cluster_namespace()
        or "default"
    )
    api = await stack.enter_async_context(kube_api(kubeconfig=settings.discovery_kubeconfig))
    changes = LocalChanges(core.fleet)
    return PoolFollower(api, namespace, name, core, changes, options.pool_poll_s), api


async def _readiness(core: ProxyCore, health: Any) -> None:
    """The gRPC health services the protocol names, kept current: `readiness` and the ext_proc
    service (and the server's overall "") serve while some engine takes requests."""
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    last = None
    while True:
        status = serving if core.fleet.routable(core.clock.now()) else not_serving
        if status != last:
            for service in READINESS_SERVICES:
                await health.set(service, status)
            last = status
        await asyncio.sleep(READINESS_EVERY_S)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def serve_epp(settings: Settings, options: EppOptions) -> None:
    """Until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running_epp(settings, options) as epp:
        log.info(
            "endpoint picker listening on %s:%d for %d engine(s)",
            options.host,
            epp.port,
            len(epp.core.fleet),
        )
        await stop.wait()
