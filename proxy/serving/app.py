"""The app factory: `create_app(settings)` builds one proxy; nothing happens at import time.

The OpenAI generation endpoints are served by a raw ASGI handler (proxy/request/entry.py) placed in
front of the FastAPI app; FastAPI serves the control plane (health, readiness, models, admin,
metrics, docs) where its conveniences cost nothing that matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from fleet.change_log import ChangeLog
from fleet.changes import FleetChanges, LocalChanges
from fleet.clock import Clock
from fleet.metrics_board import MetricsBoard
from fleet.peer_load import PeerLoad
from flowcontrol.rate_table import RateTable
from proxy.asgi import AsgiApp, Receive, Scope, Send, send_error
from proxy.control.admin_routes import admin_router
from proxy.control.colocated_planner import ColocatedPlanner
from proxy.control.discovery_loop import kubernetes_discovery
from proxy.control.lora_adapters import FleetAdapters
from proxy.control.lora_routes import lora_router
from proxy.control.peer_sync import PeerSync, SharedChanges, WorkerSeat
from proxy.control.shared_scrapes import SharedScrapes
from proxy.errors import ProxyError, error_body
from proxy.metrics import RouterMetrics
from proxy.request.anthropic_errors import AnthropicErrors
from proxy.request.audio import AudioRelay
from proxy.request.entry import Forwarder
from proxy.request.responses.handler import ResponsesApi
from proxy.request.responses.handler import serves as serves_responses
from proxy.request.responses.sqlite_store import SqliteResponseStore
from proxy.request.responses.store import ResponseStore
from proxy.request.routes import (
    ANTHROPIC_PATHS,
    AUDIO_ROUTES,
    HOT_ROUTES,
    REFUSED,
    Route,
    refusal_message,
)
from proxy.serving.access import (
    ControlPlaneKeys,
    KeyCheck,
    RequireClientKey,
    client_keys,
)
from proxy.serving.admission import AdmissionGate, AdmittedHandler
from proxy.serving.flow_gate import FlowGate
from proxy.serving.peer_touch import PeerTouch
from proxy.serving.version import installed_version
from proxy.serving.wiring import ProxyCore
from proxy.settings import Settings

log = logging.getLogger("fleet_proxy")


class FleetProxyApp:
    """ASGI entry point: hot OpenAI POSTs to the Forwarder, everything else to FastAPI.

    With client keys (`keys`) both sides check them; without, neither does any extra work.
    `asgi` is what the server runs: this app, or this app behind CORS when origins are set."""

    def __init__(
        self,
        core: ProxyCore,
        control_app: FastAPI,
        keys: KeyCheck | None = None,
        flow: FlowGate | None = None,
        sync: PeerSync | None = None,
    ) -> None:
        self.core = core
        self.flow = flow
        self.control_app = control_app  # the FastAPI app of the control plane
        self._control: AsgiApp = control_app
        self._wrong_method: AsgiApp = _wrong_method
        self.forwarder: AsgiApp
        self.audio: AsgiApp
        authorize = None if keys is None else RequireClientKey(keys)
        forwarder = Forwarder(core, authorize, flow)
        self.audio = AudioRelay(core, forwarder.bodies, authorize)
        store = responses_store(core.settings)
        self.responses = ResponsesApi(
            core, forwarder.legs, store, forwarder.bodies, authorize, flow
        )
        self.responses_route: AsgiApp = self.responses
        if keys is not None:
            self._control = ControlPlaneKeys(control_app, keys)
            self._wrong_method = ControlPlaneKeys(_wrong_method, keys)
        self.forwarder = forwarder
        s = core.settings
        self.admission: AdmissionGate | None = None
        if s.max_concurrent_requests is not None:
            # Outside the key check: a queued request has had nothing read yet.
            self.admission = AdmissionGate(
                s.max_concurrent_requests,
                s.admission_queue_size,
                s.admission_queue_timeout,
                core.prom,
            )
            self.forwarder = AdmittedHandler(self.forwarder, self.admission, core)
            self.responses_route = AdmittedHandler(self.responses, self.admission, core)
            self.audio = AdmittedHandler(self.audio, self.admission, core)
        # Each relayed path's handlers (a POST, another method); the Anthropic paths' errors
        # in Anthropic's shape. One dict lookup per request, as before.
        anthropic = (AnthropicErrors(self.forwarder), AnthropicErrors(self._wrong_method))
        self._hot: dict[str, tuple[AsgiApp, AsgiApp]] = {
            path: anthropic if path in ANTHROPIC_PATHS else (self.forwarder, self._wrong_method)
            for path in HOT_ROUTES
        }
        self._hot.update({path: (self.audio, self._wrong_method) for path in AUDIO_ROUTES})
        self.asgi: AsgiApp = self
        if s.cors_allow_origins:
            # Outermost, so that preflights (which carry no key) and refusals get CORS headers.
            self.asgi = CORSMiddleware(
                self,
                allow_origins=s.cors_allow_origins,
                allow_methods=s.cors_allow_methods,
                allow_headers=s.cors_allow_headers,
                allow_credentials=s.cors_allow_credentials,
            )
        if sync is not None:
            # Outermost: every request, refused ones too, keeps the workers' sync in step.
            self.asgi = PeerTouch(self.asgi, sync)

    @property
    def metrics(self) -> RouterMetrics:
        return self.core.metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            hot = self._hot.get(scope["path"])
            if hot is not None:
                await (hot[0] if scope["method"] == "POST" else hot[1])(scope, receive, send)
                return
            # After the hot routes: their requests pay nothing for this one.
            if serves_responses(scope["path"]):
                await self.responses_route(scope, receive, send)
                return
        await self._control(scope, receive, send)


async def _wrong_method(scope: Scope, receive: Receive, send: Send) -> None:
    error = ProxyError(405, f"{scope['path']} takes POST", code=405, headers=[(b"allow", b"POST")])
    await send_error(send, error, "")


def _no_route(method: str, path: str) -> str:
    served = ", ".join(["/v1/models", *HOT_ROUTES, *AUDIO_ROUTES, "/v1/responses"])
    return f"fleet-proxy does not serve {method} {path}; its OpenAI-compatible paths: {served}"


def _refuser(route: Route) -> Callable[[], Awaitable[Response]]:
    """The handler of a route vLLM serves and the proxy refuses (proxy/request/routes.py)."""
    kind = _REFUSAL_TYPES[route.status]
    message = refusal_message(route)

    async def refuse() -> Response:
        return _openai_error(route.status, message, kind)

    return refuse


_REFUSAL_TYPES = {403: "permission_error", 501: "not_implemented_error"}


def _openai_error(status: int, message: str, type_: str) -> Response:
    return Response(
        error_body(message, type_, None, status), status_code=status, media_type="application/json"
    )


def responses_store(settings: Settings) -> ResponseStore:
    """The Responses API's store: the configured PostgreSQL database or SQLite file (worker
    processes are given one file by their supervisor), else memory."""
    url = settings.responses_store_url
    if url is not None:
        # Imported only here: psycopg is the optional `postgres` extra.
        from proxy.request.responses.postgres_store import PostgresResponseStore

        return PostgresResponseStore(
            url.get_secret_value(),
            settings.responses_ttl,
            settings.responses_store_max_bytes,
            time.time,
        )
    return SqliteResponseStore(
        settings.responses_store_path,
        settings.responses_ttl,
        settings.responses_store_max_bytes,
        time.time,
    )


def create_app(
    settings: Settings, clock: Clock | None = None, seat: WorkerSeat | None = None
) -> FleetProxyApp:
    """`seat` makes this app one of several worker processes (proxy/serving/workers.py): it shares
    its load and the admin API's fleet changes with the others."""
    # Read here, at start-up: a missing or empty keys file stops the proxy (ValueError).
    keys = client_keys(settings.client_keys(), settings.api_keys_file)
    core = ProxyCore(settings, clock)
    flow: FlowGate | None = None
    if settings.flow_control is not None:
        # With several workers the rate limits' buckets are the shared table's: a tenant's
        # limit holds for the whole proxy, whichever worker takes each request.
        shared_rates = seat.rate_table if seat is not None else None
        flow = FlowGate(
            settings.flow_control,
            core,
            keys.tenant if keys is not None else None,
            core.prom,
            RateTable(shared_rates) if shared_rates is not None else None,
        )

    sync: PeerSync | None = None
    scrapes: SharedScrapes | None = None
    if seat is not None:
        sync = PeerSync(
            core.fleet,
            PeerLoad.attach(seat.segment, seat.index),
            ChangeLog(Path(seat.change_log)),
            settings.peer_sync_interval,
            core.clock,
            flow.queue_summary if flow is not None else None,
        )
        if seat.metrics_board and seat.health_board:
            # The first worker scrapes and checks every backend for all (docs/performance.md).
            scrapes = SharedScrapes(
                MetricsBoard.attach(seat.metrics_board),
                MetricsBoard.attach(seat.health_board),
                sync.slots,
                scraper=seat.index == 0,
            )
            core.metrics_share = scrapes
        if flow is not None:
            flow.join(sync)
        # /metrics answers for the worker that serves the scrape: say which one.
        core.prom.set_target_info({"worker": str(seat.index), "workers": str(seat.count)})
    changes: FleetChanges = SharedChanges(sync) if sync is not None else LocalChanges(core.fleet)
    # Settings refuse it with several workers: a drain must see every live request.
    planner = ColocatedPlanner(core, changes) if settings.planner_enabled else None
    adapters = FleetAdapters(
        core.fleet, lambda: core.control_client, core.clock, settings.lora_adapter_timeout
    )
    core.fleet.on_models_learned(adapters)
    # In one process only, its changes shared through the change log
    # (proxy/control/discovery_loop.py).
    discovers = settings.discovery_kubernetes and (seat is None or seat.index == 0)
    served: list[FleetProxyApp] = []  # the app the lifespan belongs to, once built

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # First: a Kubernetes client that cannot be configured stops start-up before anything
        # else has started.
        stack = contextlib.AsyncExitStack()
        if discovers:
            try:
                control.state.discovery = await stack.enter_async_context(
                    kubernetes_discovery(core, changes)
                )
            except BaseException:
                if sync is not None:
                    sync.close()  # the shared segment's view, which nothing else will close
                if scrapes is not None:
                    scrapes.close()
                raise
        await core.start()
        sync_task = None
        if sync is not None:
            sync.step()  # before the first request: peers' load and changes made before start
            sync_task = asyncio.create_task(sync.run(), name="peer-sync")
        discovery_task = None
        if control.state.discovery is not None:
            discovery_task = asyncio.create_task(control.state.discovery.run(), name="discovery")
        planner_task = None
        if planner is not None:
            planner_task = asyncio.create_task(planner.run(), name="planner")
        # Everything built so far lives as long as the process: keep it out of the cyclic
        # collector's scans, which otherwise grow with every module the app imported.
        gc.freeze()
        try:
            yield
        finally:
            if discovery_task is not None:
                discovery_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await discovery_task
            await stack.aclose()
            await adapters.close()
            if planner_task is not None and planner is not None:
                # Its workers stay up: a restarted proxy finds them in the state file.
                planner_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await planner_task
                planner.close()
            if sync_task is not None:
                sync_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sync_task
            for started in served:
                await started.responses.close()
            await core.stop()
            if sync is not None:
                sync.close()
            if scrapes is not None:
                scrapes.close()

    control = FastAPI(title="fleet-proxy", lifespan=lifespan)

    @control.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        if exc.status_code == 401:
            kind = "authentication_error"
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":  # no route, not a handler's 404
            message = _no_route(request.method, request.url.path)
        return _openai_error(exc.status_code, message, kind)

    @control.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> Response:
        parts = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        return _openai_error(400, "; ".join(parts), "invalid_request_error")

    @control.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @control.get("/ready")
    async def ready() -> JSONResponse:
        routable = core.fleet.routable(core.clock.now())
        if routable:
            return JSONResponse({"ready": True, "backends": len(routable)})
        return JSONResponse(
            status_code=503,
            content={"ready": False, "backends": 0},
            headers={"retry-after": "1"},
        )

    # vLLM's /version names the engine's release; the proxy's names its own, one for the fleet.
    proxy_version = {"version": installed_version()}

    @control.get("/version")
    async def version() -> dict[str, str]:
        return proxy_version

    aliases = settings.model_aliases

    @control.get("/v1/models")
    async def models() -> dict[str, Any]:
        served = core.fleet.models(core.clock.now())
        data = [{"id": m, "object": "model", "owned_by": "fleet-proxy"} for m in served]
        if aliases:
            # An alias is listed while its model is served; `root` names that model.
            ready = set(served)
            data += [
                {"id": a, "object": "model", "owned_by": "fleet-proxy", "root": m}
                for a, m in aliases.items()
                if m in ready
            ]
        return {"object": "list", "data": data}

    for route in REFUSED:
        control.add_api_route(
            route.path, _refuser(route), methods=list(route.methods), include_in_schema=False
        )
    control.include_router(admin_router(core, changes, sync, planner, flow))
    control.include_router(lora_router(adapters, settings.admin_token))
    Instrumentator(registry=core.prom).instrument(control).expose(control, include_in_schema=False)
    control.state.planner = planner
    control.state.discovery = None  # the running DiscoveryLoop, once started
    app = FleetProxyApp(core, control, keys, flow, sync)
    served.append(app)
    return app
