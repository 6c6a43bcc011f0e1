"""`fleet-proxy epp`: the endpoint picker's gRPC server over the proxy's own fleet state.

The fleet, its scraper and health checks, the policy and the metrics are the proxy's
(`ProxyCore`); only the data plane is Envoy's. grpc is imported here, never by `serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc import aio

from proxy.gateway.ext_proc import ExternalProcessor
from proxy.gateway.options import EppOptions
from proxy.gateway.picking import EndpointPicker
from proxy.serving.wiring import ProxyCore
from proxy.settings import Settings

log = logging.getLogger("fleet_proxy.gateway")

# Seconds a stop gives the streams in progress (requests the gateway is forwarding) to end.
STOP_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class RunningEpp:
    port: int
    core: ProxyCore


@contextlib.asynccontextmanager
async def running_epp(settings: Settings, options: EppOptions) -> AsyncIterator[RunningEpp]:
    """The picker listening on `options.port` (0: a free one), its fleet scraped."""
    core = ProxyCore(settings)
    await core.start()
    server: Any = aio.server()
    metrics_server: Any = None
    try:
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessor(
                EndpointPicker(core, options.fallbacks, options.shedding), core.metrics
            ),
            server,
        )
        port = server.add_insecure_port(f"{options.host}:{options.port}")
        if port == 0:
            raise OSError(f"cannot listen on {options.host}:{options.port}")
        await server.start()
        if options.metrics_port is not None:
            from prometheus_client import start_http_server

            metrics_server, _ = start_http_server(
                options.metrics_port, options.host, registry=core.prom
            )
        yield RunningEpp(port, core)
    finally:
        await server.stop(STOP_GRACE_S)
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        await core.stop()


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
