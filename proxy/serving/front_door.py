"""The client-facing HTTP server: uvicorn's httptools protocol with limits on what one client
may hold (docs/reliability.md).

uvicorn alone bounds neither the size nor the count of request headers, and starts no timer
before a request is complete: a client could park a huge header in memory, dribble a request
for as long as it likes, or open sockets until the process runs out of file descriptors. The
protocol class made here adds:
- header limits: a request line plus headers over `client_max_header_bytes`, or more than
  `client_max_header_count` headers, get 431; bytes are counted as they arrive, so one header
  that never ends is refused once the limit is passed rather than buffered;
- a header timeout from connection open (or from a keep-alive request's first byte) to the end
  of the headers, and a body timeout from there to the end of the body: 408;
- a cap on the bytes after a request's headers (body, chunked framing, trailers) on every
  route, at twice `max_body_bytes` plus `client_max_header_bytes`: 413;
- a cap on open connections per serving process: one over it gets 503 at once and is closed;
- parser errors answered 400;
all in the OpenAI error shape, each closing the connection and counted in
`fleet_proxy_client_connections_refused_total{reason}`, with one warning line per 10 s at most.

The work per request is a few attribute checks: a request that arrives in one read arms no
timer of its own (a connection arms one header timer when it opens).

`uvicorn_config` is the one serving configuration: `fleet-proxy serve`, each worker process
(proxy/serving/workers.py) and the tests' real proxy (tests/support/servers.py) all use it.
"""

from __future__ import annotations

import asyncio
import http
import logging
import math
import resource
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import httptools
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.errors import ProxyError
from proxy.settings import Settings

if TYPE_CHECKING:
    from proxy.metrics import RouterMetrics
    from proxy.serving.app import FleetProxyApp

log = logging.getLogger("fleet_proxy.front_door")

# The listen() queue of the proxy's sockets (proxy/serving/workers.py binds its own with it too).
BACKLOG = 4096
# At most one warning line per this many seconds about refused connections.
WARN_EVERY_S = 10.0
# A request line's bytes beyond its URL: the method, two spaces, "HTTP/1.1", CRLF (about).
_REQUEST_LINE_EXTRA = 16
# Seconds after the shutdown grace period at which uvicorn cancels request tasks still
# running (GracefulServer has closed their connections by then; they end within ~50 ms).
SHUTDOWN_BACKSTOP_S = 5.0
# File descriptors a serving process needs besides one per client connection and one per
# upstream request (at most one per client connection): listening sockets, backend scrapes
# and health checks, idle upstream keep-alive connections, logs, shared memory.
FD_RESERVE = 1024

REASONS = (
    "header_too_large",
    "too_many_headers",
    "header_timeout",
    "body_timeout",
    "body_too_large",
    "connection_limit",
    "bad_request",
)


@dataclass(frozen=True, slots=True)
class FrontDoorLimits:
    max_connections: int
    max_header_count: int
    max_header_bytes: int
    max_body_bytes: int
    header_timeout: float
    body_timeout: float
    keep_alive_timeout: float

    @classmethod
    def from_settings(cls, s: Settings) -> FrontDoorLimits:
        return cls(
            max_connections=s.client_max_connections,
            max_header_count=s.client_max_header_count,
            max_header_bytes=s.client_max_header_bytes,
            max_body_bytes=s.max_body_bytes,
            header_timeout=s.client_header_timeout,
            body_timeout=s.client_body_timeout,
            keep_alive_timeout=s.client_keep_alive_timeout,
        )


def error_response(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    default_headers: Iterable[tuple[bytes, bytes]] = (),
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
) -> bytes:
    """A whole HTTP/1.1 response with an OpenAI-shaped error body that closes the connection."""
    body = ProxyError(status, message, type=type).body()
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, http.HTTPStatus(status).phrase.encode())]
    for name, value in (*default_headers, *extra_headers):
        lines.append(name + b": " + value + b"\r\n")
    lines.append(b"content-type: application/json\r\n")
    lines.append(b"content-length: %d\r\n" % len(body))
    lines.append(b"connection: close\r\n\r\n")
    lines.append(body)
    return b"".join(lines)


class FrontDoorStats:
    """What every connection of one server shares: the count of open connections (uvicorn's
    own set of them), and the refusals, counted in the metrics and reported in a warning line
    at most once per `warn_every` seconds with the count since the last line."""

    def __init__(
        self,
        metrics: RouterMetrics | None,
        *,
        warn_every: float = WARN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connections: set[Any] = set()  # replaced by the server's set once it has one
        self._metrics = metrics
        self._warn_every = warn_every
        self._clock = clock
        self._last_warning = -math.inf
        self._unreported: dict[str, int] = {}
        if metrics is not None:
            metrics.client_connections.set_function(lambda: len(self.connections))
            for reason in REASONS:  # each series from 0, for rates and alerts
                metrics.client_refused.labels(reason)

    def open_connections(self) -> int:
        return len(self.connections)

    def refused(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.client_refused.labels(reason).inc()
        self._unreported[reason] = self._unreported.get(reason, 0) + 1
        now = self._clock()
        if now - self._last_warning < self._warn_every:
            return
        self._last_warning = now
        counts = ", ".join(f"{r} {n}" for r, n in sorted(self._unreported.items()))
        total = sum(self._unreported.values())
        self._unreported = {}
        log.warning(
            "refused %d client connection(s) since the last report (%s); %d open",
            total,
            counts,
            len(self.connections),
        )


class _Refusal(Exception):
    """Raised from a parser callback: stops the parser; data_received answers it."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def front_door_protocol(limits: FrontDoorLimits, stats: FrontDoorStats) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `limits`; pass the class as `uvicorn.Config(http=...)`."""
    max_connections = limits.max_connections
    max_header_count = limits.max_header_count
    max_header_bytes = limits.max_header_bytes
    header_timeout = limits.header_timeout
    body_timeout = limits.body_timeout
    keep_alive_timeout = limits.keep_alive_timeout
    # What may follow a request's headers: its body (the generation endpoints hold that to
    # max_body_bytes exactly; the control plane's would be read whole), room as large again
    # for chunked framing, and trailers, which httptools buffers whole as it does headers.
    max_after_head = 2 * limits.max_body_bytes + max_header_bytes
    too_many_headers = f"more than {max_header_count} request headers"
    header_too_large = f"request line and headers over the {max_header_bytes}-byte limit"
    body_too_large = (
        f"request over {max_after_head} bytes after its headers (body, chunked framing and "
        f"trailers; the body limit is {limits.max_body_bytes} bytes)"
    )
    # Called straight, not through super(): these run on every request.
    base_headers_complete = HttpToolsProtocol.on_headers_complete
    base_message_complete = HttpToolsProtocol.on_message_complete
    base_response_complete = HttpToolsProtocol.on_response_complete
    busy = (
        f"this server has {max_connections} open connections, its limit; "
        "retry on a new connection shortly"
    )

    class FrontDoorProtocol(HttpToolsProtocol):
        def __init__(
            self,
            config: Config,
            server_state: ServerState,
            app_state: dict[str, Any],
            _loop: asyncio.AbstractEventLoop | None = None,
        ) -> None:
            super().__init__(config, server_state, app_state, _loop)
            # uvicorn's Config takes whole seconds only.
            self.timeout_keep_alive = keep_alive_timeout  # type: ignore[assignment]
            stats.connections = server_state.connections
            # True from connection open, and again from the end of each request's body, until
            # the next request's headers are complete.
            self._reading_head = True
            # Bytes read since the current request's head began (whole reads: an upper bound
            # for a head that began at the start of one), while _reading_head.
            self._head_bytes = 0
            # Bytes read since (the read after) its head ended, while not _reading_head.
            self._body_bytes = 0
            self._read_len = 0  # of the read being parsed
            # Bytes of the next head that _head_bytes may miss: it may have begun in the read
            # in which the last request ended, counted as that request's.
            self._head_slack = 0
            self._head_timer: asyncio.TimerHandle | None = None
            self._body_timer: asyncio.TimerHandle | None = None
            self._stopped = False  # refused: what else arrives is ignored
            self._deferred: bytes | None = None  # a refusal waiting for an earlier response

        # --- connection ---

        def connection_made(  # type: ignore[override]
            self, transport: asyncio.Transport
        ) -> None:
            if len(self.connections) >= max_connections:
                # Refused before anything is set up: the descriptor is freed at once.
                self.transport = transport
                self._stopped = True
                transport.write(
                    error_response(
                        503,
                        busy,
                        type="service_unavailable",
                        default_headers=self.server_state.default_headers,
                        extra_headers=[(b"retry-after", b"1")],
                    )
                )
                transport.close()
                stats.refused("connection_limit")
                return
            super().connection_made(transport)
            self._head_timer = self.loop.call_later(header_timeout, self._header_timed_out)

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timers()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._stopped:
                return
            self._unset_keepalive_if_required()
            n = self._read_len = len(data)
            if self._reading_head:
                self._head_bytes += n
            else:
                self._body_bytes += n
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self._cancel_timers()
                    self.handle_websocket_upgrade()
                # Otherwise served as plain HTTP; the proxy has no WebSocket routes.
                return
            except httptools.HttpParserError as e:
                refusal = e.__context__
                if isinstance(refusal, _Refusal):
                    self._refuse(refusal.status, refusal.reason, refusal.message)
                else:
                    self.send_400_response(f"malformed HTTP request: {e}")
                return
            if self._reading_head:
                if self._head_bytes:  # a request's head is incomplete
                    if self._head_bytes > max_header_bytes:
                        # Refused before the rest arrives: httptools would buffer all of it.
                        self._refuse(431, "header_too_large", header_too_large)
                    elif self._head_timer is None and self._idle():
                        self._head_timer = self.loop.call_later(
                            header_timeout, self._header_timed_out
                        )
            elif self._body_bytes > max_after_head:
                self._refuse(413, "body_too_large", body_too_large)
            elif self._body_timer is None:
                self._body_timer = self.loop.call_later(body_timeout, self._body_timed_out)

        # --- parser callbacks ---

        def on_headers_complete(self) -> None:
            if len(self.headers) > max_header_count:
                raise _Refusal(431, "too_many_headers", too_many_headers)
            size = self._head_bytes
            if size == 0 or size + self._head_slack > max_header_bytes:
                # Not known to fit (the head began inside a read, or its reads, a body perhaps
                # with them, may run over the limit): measure the head itself.
                size = len(self.url) + _REQUEST_LINE_EXTRA
                for name, value in self.headers:
                    size += len(name) + len(value) + 4
                if size > max_header_bytes:
                    raise _Refusal(431, "header_too_large", header_too_large)
            self._reading_head = False
            self._head_bytes = 0
            self._head_slack = 0
            self._body_bytes = 0
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            base_headers_complete(self)

        def on_message_complete(self) -> None:
            base_message_complete(self)
            self._reading_head = True
            self._head_slack = self._read_len
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def on_response_complete(self) -> None:
            base_response_complete(self)
            if self._head_bytes or self._deferred is not None:
                self._after_busy_response()

        # --- refusals ---

        def send_400_response(self, msg: str) -> None:
            self._refuse(400, "bad_request", msg)

        def _idle(self) -> bool:
            """No response is being sent or waiting to be (the newest request is answered)."""
            return self.cycle is None or self.cycle.response_complete

        def _refuse(self, status: int, reason: str, message: str, *, answer: bool = True) -> None:
            self._stopped = True
            self._cancel_timers()
            stats.refused(reason)
            response = (
                error_response(status, message, default_headers=self.server_state.default_headers)
                if answer
                else b""
            )
            cycle = self.cycle
            if self._reading_head:
                # The refused request has no cycle: any there is belongs to an earlier request.
                if self._idle():
                    self._write_and_close(response)
                else:
                    # Answered in order, once the earlier responses are out.
                    self._deferred = response
                    self.flow.pause_reading()
                return
            # The refused request is the newest cycle, its body incomplete.
            if not cycle.response_complete:
                # Its app's receive() says http.disconnect and its sends are dropped, so
                # nothing is written twice.
                cycle.disconnected = True
                cycle.message_event.set()
            if cycle.response_started or self.pipeline:
                # An answer is under way (or an earlier request's, ahead of this one):
                # closing is all that is left.
                self.transport.close()
            else:
                self._write_and_close(response)

        def _write_and_close(self, response: bytes) -> None:
            if not self.transport.is_closing():
                if response:
                    self.transport.write(response)
                self.transport.close()

        def _after_busy_response(self) -> None:
            if self.transport.is_closing() or not self._idle():
                return
            if self._deferred is not None:
                self._unset_keepalive_if_required()
                self._write_and_close(self._deferred)
            elif self._reading_head and self._head_bytes and self._head_timer is None:
                # The next request began while this response was going out: its header
                # timeout runs from now, in place of the keep-alive wait.
                self._unset_keepalive_if_required()
                self._head_timer = self.loop.call_later(header_timeout, self._header_timed_out)

        def _header_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or not self._reading_head:
                return
            # A connection that never sent a byte gets no answer: a client that opened it for
            # a request it has yet to send would take an answer for that request's.
            self._refuse(
                408,
                "header_timeout",
                f"request headers not received within {header_timeout:g} s",
                answer=self._head_bytes > 0,
            )

        def _body_timed_out(self) -> None:
            self._body_timer = None
            if self.transport.is_closing() or self._reading_head:
                return
            if self.flow.read_paused:
                # The server stopped reading (the app has not taken the body so far, or
                # requests are queued ahead): the wait is not the client's.
                self._body_timer = self.loop.call_later(body_timeout, self._body_timed_out)
                return
            self._refuse(
                408, "body_timeout", f"request body not received within {body_timeout:g} s"
            )

        def _cancel_timers(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

    return FrontDoorProtocol


def uvicorn_config(app: FleetProxyApp, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The proxy's serving configuration; `overrides` replace any of its uvicorn.Config
    arguments (the tests' port 0 and `loop="none"`)."""
    stats = FrontDoorStats(app.core.metrics)
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "http": front_door_protocol(FrontDoorLimits.from_settings(settings), stats),
        # The proxy serves no WebSocket routes: an Upgrade request is served as plain HTTP.
        "ws": "none",
        "access_log": False,
        "log_level": settings.log_level,
        "backlog": BACKLOG,
        # The proxy does not use the client address, so X-Forwarded-* parsing is wasted work
        # on every request; and it does not advertise its server software.
        "proxy_headers": False,
        "server_header": False,
        # GracefulServer ends what is left at the grace period; this is uvicorn's last resort.
        "timeout_graceful_shutdown": settings.shutdown_grace_period + SHUTDOWN_BACKSTOP_S,
    }
    options.update(overrides)
    return uvicorn.Config(app.asgi, **options)


class GraceDeadline(Protocol):
    """What the server tells the app when a stop's grace period is over."""

    def cut_in_flight(self) -> None:
        """The requests still running are about to lose their connections."""


class GracefulServer(uvicorn.Server):
    """uvicorn's server with a bounded graceful stop. On SIGTERM or SIGINT uvicorn closes the
    listening sockets (new connections are refused), closes idle keep-alive connections and
    marks busy ones to close after their response; requests in flight and streams finish.
    After `grace` seconds this server closes every connection still open: each client sees
    its connection close (a stream stops short of its end, never a false end), and each
    request, seeing its client gone, closes its upstream request (the backend aborts it).

    uvicorn's own `timeout_graceful_shutdown` would instead cancel the request tasks, which
    leaves an error and a traceback per request in the log; it stays as a backstop,
    `SHUTDOWN_BACKSTOP_S` later."""

    def __init__(self, config: Config, grace: float, app: GraceDeadline | None = None) -> None:
        super().__init__(config)
        self._grace = grace
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        deadline = asyncio.get_running_loop().call_later(self._grace, self._cut)
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()

    def _cut(self) -> None:
        connections = list(self.server_state.connections)
        if not connections:
            return
        log.warning(
            "shutdown grace period of %g s over: closing %d connection(s) still open",
            self._grace,
            len(connections),
        )
        if self._app is not None:
            self._app.cut_in_flight()
        for connection in connections:
            transport = connection.transport
            if not transport.is_closing():
                transport.close()


class AnnouncingServer(GracefulServer):
    """A uvicorn server that calls `on_listening(port)` once its socket is bound and the app
    has started: what is announced then accepts connections, on the port really bound (the
    one the kernel chose for port 0)."""

    def __init__(
        self,
        config: Config,
        on_listening: Callable[[int], None],
        grace: float,
        app: GraceDeadline | None = None,
    ) -> None:
        super().__init__(config, grace, app)
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_listening(int(self.servers[0].sockets[0].getsockname()[1]))


def fit_open_files(max_connections: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE (up to the hard limit) so that
    `max_connections` client connections fit, each with an upstream request, plus
    FD_RESERVE; warn when they still cannot. Returns the soft limit now in force."""
    want = 2 * max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, e)
    if soft < want:
        log.warning(
            "open-file limit %d (hard limit %d) is below the %d that client_max_connections=%d "
            "needs (a client connection and its upstream request each, plus %d): past it "
            "connections fail without an answer; raise `ulimit -n` or lower "
            "client_max_connections",
            soft,
            hard,
            want,
            max_connections,
            FD_RESERVE,
        )
    return soft
