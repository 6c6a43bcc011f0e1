"""The hot path's entry: a raw ASGI handler for the OpenAI endpoints.

Why not a FastAPI route with httpx: measured here that costs ~14x the CPU per request. This
handler reads and parses the body once, builds the routing context, and hands the request to
its session (proxy/request/session.py), which owns it to the end: legs on backends, relaying, moves.

A client that goes away cancels the session (watched from 50 ms into a request, so within
50 ms at worst), and closing the upstream connection makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Protocol

import orjson

from policies.policy import RequestContext
from proxy.asgi import Receive, Scope, Send, send_error
from proxy.errors import ProxyError
from proxy.ports import FlowControl, FlowTicket, RequestLog, RequestServices
from proxy.request.body_budget import BodyBudget
from proxy.request.body_reader import BodyReader
from proxy.request.context import ContextReader
from proxy.request.leg_services import LegServices
from proxy.request.legs import GENERATION
from proxy.request.routes import HOT_ROUTES
from proxy.request.session import RequestSession
from proxy.stream.continuation import Movability, movability

log = logging.getLogger("fleet_proxy.forward")

# Request headers that describe this hop only, or that the proxy itself consumes.
_DROP_REQUEST_HEADERS = frozenset(
    {
        b"host",
        b"content-length",
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authorization",
        b"proxy-connection",
        b"x-request-id",
        b"x-fleet-debug",
        # The body sent on is the JSON the proxy parsed (an encoded one would not have parsed),
        # rewritten at times: a backend that decodes by this header would fail on it.
        b"content-encoding",
        # Settled with the client (uvicorn answers 100-continue) before the proxy reads the
        # body; a backend would only answer an expectation it does not know with 417.
        b"expect",
    }
)
# The client's credentials for this proxy: kept off the backends unless
# forward_client_authorization says otherwise (a backend_api_key is sent in their place).
_CLIENT_CREDENTIALS = frozenset({b"authorization", b"x-api-key"})
# Fields that take one value. A client's repeated one reaches backends once, as the proxy read
# it (the last): some servers refuse a request that repeats them.
_SINGLE_VALUED_REQUEST_HEADERS = frozenset(
    {
        b"content-type",
        b"content-location",
        b"content-range",
        b"etag",
        b"max-forwards",
        b"server",
        b"user-agent",
    }
)
# A request still running after this long starts watching for its client leaving.
WATCH_AFTER_S = 0.05

_DISABLED = Movability(movable=False, planned=False, reason="disabled")
_NOT_STREAMED = Movability(movable=False, planned=False, reason="not_streamed")


class _Watch:
    """Shared between a request and its disconnect watcher."""

    __slots__ = ("disconnected", "finished")

    def __init__(self) -> None:
        self.disconnected = False
        self.finished = False


class Authorize(Protocol):
    """Whether a request may be served, decided from its headers before its body is read (a
    client refused gets nothing buffered): None to serve it, or the error to answer with."""

    def __call__(self, headers: dict[str, str]) -> ProxyError | None: ...


class Forwarder:
    def __init__(
        self,
        core: RequestServices,
        authorize: Authorize | None = None,
        flow: FlowControl | None = None,
    ) -> None:
        """`flow`: flow control, when configured; a request then waits there while its
        model's backends are saturated, and is routed when it leaves the queue."""
        self.core = core
        self._authorize = authorize
        self._flow = flow
        self.settings = core.settings
        self.legs = LegServices(core)
        self._contexts = ContextReader(core.settings, debug=core.settings.debug_receipts)
        self._watchers: set[asyncio.Task[None]] = set()
        self._movable = core.settings.movable_requests
        self._assemble = core.settings.assemble_non_streamed
        self._request_log: RequestLog | None = core.request_log
        self._aliases = dict(core.settings.model_aliases) or None
        self._drop = _DROP_REQUEST_HEADERS
        self._max_forwarded_header_bytes = core.settings.max_forwarded_header_bytes
        if not core.settings.forward_client_authorization:
            self._drop = _DROP_REQUEST_HEADERS | _CLIENT_CREDENTIALS
        bodies = BodyBudget(core.settings.max_body_bytes_in_flight, core.settings.body_bytes_wait)
        self._bodies = bodies
        # The process's body reader and budget, shared with the Responses API and the audio
        # uploads.
        self.bodies = BodyReader(
            bodies, core.settings.max_body_bytes, core.metrics.body_budget_refusals.inc
        )
        self._read_body = self.bodies.read
        core.metrics.body_bytes_in_flight.set_function(lambda: bodies.held)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint, generates = HOT_ROUTES[scope["path"]]
        arrived = time.perf_counter()
        # One pass over the headers: all of them for routing, the end-to-end ones for upstream.
        headers: dict[str, str] = {}
        upstream: list[tuple[bytes, bytes]] = []  # as the client sent them, in order
        drop = self._drop
        forwarded = 0  # bytes of the headers going on, as a backend's parser counts them
        for k, v in scope["headers"]:
            name = k.decode("latin-1")
            if name in headers and k in _SINGLE_VALUED_REQUEST_HEADERS:
                upstream = [h for h in upstream if h[0] != k]
            headers[name] = v.decode("latin-1")
            if k not in drop:
                upstream.append((k, v))
                forwarded += len(k) + len(v) + 4
        named = headers.get("connection")
        if named is not None:
            upstream = _without_connection_named(upstream, named)
        client_id = headers.get("x-request-id")
        request_id = client_id or os.urandom(16).hex()
        # vLLM keys its requests by this id, so two clients sending the same x-request-id must
        # not meet on one engine: the client's id, kept as a prefix to trace it, made unique.
        upstream_id = request_id if client_id is None else f"{client_id}-{os.urandom(6).hex()}"
        upstream.append((b"x-request-id", upstream_id.encode("latin-1")))
        status = 500
        session: RequestSession | None = None
        model: str | None = None
        held = 0  # body bytes taken from the budget, given back when the request ends
        ticket: FlowTicket | None = None
        try:
            try:
                if forwarded > self._max_forwarded_header_bytes:
                    raise _headers_too_large(forwarded, self._max_forwarded_header_bytes)
                if self._authorize is not None:
                    refusal = self._authorize(headers)
                    if refusal is not None:
                        raise refusal
                body = await self._read_body(receive, headers.get("content-length"))
                held = len(body)
                ctx = self._contexts.read(endpoint, generates, body, headers, request_id)
                if self._aliases is not None:
                    body = self._dealias(ctx, body, self._aliases)
                model = ctx.model
                prompt_tokens = self.core.prompt_tokens  # None unless routing uses KV events
                # A LoRA adapter's blocks are hashed with the adapter: the engines' events cannot
                # tell where its prompt is cached, so without token ids it goes by the approximate
                # index (which keys prompts by model name).
                if (
                    prompt_tokens is not None
                    and generates
                    and not self.core.fleet.is_adapter(model)
                ):
                    ids = await prompt_tokens.token_ids(endpoint, model, ctx.body)
                    if ids is not None:
                        ctx.prompt_token_ids = ids
                        ctx.prompt_tokens = len(ids)  # exact: no counting needed
                tokens = self.core.tokens
                if (
                    tokens is not None
                    and tokens.mode != "estimate"
                    and not ctx.prompt_is_token_ids
                    and ctx.prompt_token_ids is None
                ):
                    ctx.prompt_tokens = await tokens.count(
                        ctx.prompt_text, model, endpoint, ctx.body
                    )
                if self._flow is not None and generates:
                    # Last before routing, with no await after it: a request dispatched from
                    # the queue is routed (and charged) with the fleet as it is then.
                    ticket = await self._flow.admit(ctx, receive)
                session = RequestSession(
                    self.core, self.legs, scope["path"], ctx, body, upstream, send, arrived,
                    self._movability(ctx),
                )  # fmt: skip
                if ticket is not None:
                    session.let_through(ticket)
                status = await self._serve(receive, session)
            except ProxyError as e:
                status = e.status
                if ticket is not None and ticket.rate is not None:
                    e.headers = [*e.headers, *ticket.rate.headers]  # an error is an answer too
                await send_error(send, e, request_id)
            except Exception:
                # Never a traceback to the client; the log keeps it.
                log.exception("request %s failed inside the proxy", request_id)
                await send_error(
                    send,
                    ProxyError(500, "internal proxy error", type="internal_error"),
                    request_id,
                )
            self.core.metrics.count_request(endpoint, status, model)
            request_log = self._request_log
            if request_log is not None and request_log.sampled():
                finished = session.finished() if session is not None else None
                request_log.record(endpoint, request_id, status, arrived, finished, ticket)
        finally:
            self._bodies.release(held)
            if ticket is not None:
                self._flow_done(ticket, session)

    def _flow_done(self, ticket: FlowTicket, session: RequestSession | None) -> None:
        flow = self._flow
        assert flow is not None
        # Output tokens count as a program's attained service, and usage against its tenant's
        # token limit, where they are known.
        wanted = ticket.program or (ticket.rate is not None and ticket.rate.tokens is not None)
        flow.done(ticket, session.finished() if session is not None and wanted else None)

    @staticmethod
    def _dealias(ctx: RequestContext, body: bytes, aliases: dict[str, str]) -> bytes:
        """A request for an alias goes on under the served model's name: routing, prefix
        hashing and the backend all see that name. Other requests keep their bytes."""
        served = aliases.get(ctx.model)
        if served is None:
            return body
        ctx.model = served
        ctx.body["model"] = served
        return orjson.dumps(ctx.body)

    def _movability(self, ctx: RequestContext) -> Movability | None:
        if ctx.endpoint not in GENERATION:
            return None
        if not self._movable:
            return _DISABLED
        if not ctx.stream and not self._assemble:
            m = _NOT_STREAMED
        else:
            m = movability(ctx.endpoint, ctx.body)
        if not m.movable:
            # "unknown_field:NAME" counts as "unknown_field": a label per name a client makes
            # up would grow /metrics (and the registry) without bound.
            self.core.metrics.count_not_movable(m.reason.partition(":")[0])
        return m

    async def _serve(self, receive: Receive, session: RequestSession) -> int:
        watch = _Watch()
        task = asyncio.current_task()
        assert task is not None
        # Most answers are done before this: they never get a watcher task (one per request
        # was ~5% of the proxy's CPU). A client that leaves sooner is still noticed at once
        # when the watcher starts, since uvicorn keeps the disconnect for receive().
        start_watching = asyncio.get_running_loop().call_later(
            WATCH_AFTER_S, self._start_watcher, receive, task, watch
        )
        try:
            return await session.run()
        except asyncio.CancelledError:
            if not watch.disconnected:
                raise
            # The client left: the upstream request was closed by the cancellation.
            task.uncancel()
            if self.core.grace_over:
                return 503  # the proxy's stop closed the connection, past its grace period
            self.core.metrics.client_disconnects.inc()
            return 499
        finally:
            watch.finished = True
            start_watching.cancel()

    def _start_watcher(self, receive: Receive, task: asyncio.Task[Any], watch: _Watch) -> None:
        if watch.finished:
            return
        # Not cancelled on the way out: uvicorn answers the watcher's receive() with
        # http.disconnect once the response is complete, and the watcher then just returns.
        watcher = asyncio.create_task(_watch_disconnect(receive, task, watch))
        self._watchers.add(watcher)  # the loop keeps only weak references to tasks
        watcher.add_done_callback(self._watchers.discard)


def _headers_too_large(size: int, limit: int) -> ProxyError:
    return ProxyError(
        431,
        f"the request's headers to forward are {size} bytes, over the {limit}-byte limit "
        "(max_forwarded_header_bytes)",
        code=431,
    )


def _without_connection_named(
    upstream: list[tuple[bytes, bytes]], connection: str
) -> list[tuple[bytes, bytes]]:
    """Drop the headers a client's `Connection:` names: they are for this hop only."""
    named = {t.strip().lower().encode("latin-1") for t in connection.split(",")}
    named -= {b"close", b"keep-alive", b""}
    if not named:
        return upstream
    return [(k, v) for k, v in upstream if k not in named]


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], watch: _Watch) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    if not watch.finished:
        watch.disconnected = True
        task.cancel()
