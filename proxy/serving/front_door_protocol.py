"""uvicorn's httptools protocol with limits on what one client may hold (docs/reliability.md).

uvicorn alone bounds neither the size nor the count of request headers, and starts no timer
before a request is complete: a client could park a huge header in memory, dribble a request
for as long as it likes, or open sockets until the process runs out of file descriptors.
`FrontDoorProtocol` adds:
- header limits: a request line plus headers over `client_max_header_bytes`, or more than
  `client_max_header_count` headers, get 431; bytes are counted as they arrive, so one header
  that never ends is refused once the limit is passed rather than buffered;
- a header timeout from connection open (or from a keep-alive request's first byte) to the end
  of the headers, and a body timeout from there to the end of the body: 408;
- a cap on the bytes after a request's headers (body, chunked framing, trailers) on every
  route, at twice `max_body_bytes` plus `client_max_header_bytes`: 413;
- a cap on open connections per serving process: when the table is full, a new connection
  takes the place of one that is waiting (sent nothing or part of its headers, oldest first;
  else one dribbling its body), per proxy/serving/connection_table.py; with none to close it
  gets 503 at once and is closed;
- parser errors answered 400;
all in the OpenAI error shape, each closing the connection and counted by `FrontDoorStats`
(proxy/serving/refusal_stats.py).

The work per request is a few attribute checks: a request that arrives in one read arms no
timer of its own (a connection arms one header timer when it opens).
"""

from __future__ import annotations

import asyncio
import http
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_remote_addr
from uvicorn.server import ServerState

from proxy.errors import ProxyError
from proxy.serving.connection_table import ConnectionTable, DoorState
from proxy.serving.refusal_stats import FrontDoorStats
from proxy.settings import Settings

# A request line's bytes beyond its URL: the method, two spaces, "HTTP/1.1", CRLF (about).
_REQUEST_LINE_EXTRA = 16

# Called straight, not through super(): these run on every request.
_base_headers_complete = HttpToolsProtocol.on_headers_complete
_base_message_complete = HttpToolsProtocol.on_message_complete
_base_response_complete = HttpToolsProtocol.on_response_complete


@dataclass(frozen=True, slots=True)
class FrontDoorLimits:
    max_connections: int
    max_header_count: int
    max_header_bytes: int
    max_body_bytes: int
    header_timeout: float
    body_timeout: float
    keep_alive_timeout: float
    address_share: float = 0.5

    @classmethod
    def from_settings(cls, s: Settings) -> FrontDoorLimits:
        return cls(
            max_connections=s.client_max_connections,
            address_share=s.client_address_share,
            max_header_count=s.client_max_header_count,
            max_header_bytes=s.client_max_header_bytes,
            max_body_bytes=s.max_body_bytes,
            header_timeout=s.client_header_timeout,
            body_timeout=s.client_body_timeout,
            keep_alive_timeout=s.client_keep_alive_timeout,
        )


@dataclass(frozen=True, slots=True)
class DoorRules:
    """`FrontDoorLimits` as the protocol checks them, with the refusals' messages: worked out
    once per server, read by every connection."""

    max_connections: int
    max_header_count: int
    max_header_bytes: int
    max_after_head: int
    header_timeout: float
    body_timeout: float
    keep_alive_timeout: float
    too_many_headers: str
    header_too_large: str
    body_too_large: str
    busy: str
    address_busy: str
    evicted: str

    @classmethod
    def from_limits(cls, limits: FrontDoorLimits) -> DoorRules:
        # What may follow a request's headers: its body (the generation endpoints hold that to
        # max_body_bytes exactly; the control plane's would be read whole), room as large again
        # for chunked framing, and trailers, which httptools buffers whole as it does headers.
        max_after_head = 2 * limits.max_body_bytes + limits.max_header_bytes
        return cls(
            max_connections=limits.max_connections,
            max_header_count=limits.max_header_count,
            max_header_bytes=limits.max_header_bytes,
            max_after_head=max_after_head,
            header_timeout=limits.header_timeout,
            body_timeout=limits.body_timeout,
            keep_alive_timeout=limits.keep_alive_timeout,
            too_many_headers=f"more than {limits.max_header_count} request headers",
            header_too_large=(
                f"request line and headers over the {limits.max_header_bytes}-byte limit"
            ),
            body_too_large=(
                f"request over {max_after_head} bytes after its headers (body, chunked framing "
                f"and trailers; the body limit is {limits.max_body_bytes} bytes)"
            ),
            busy=(
                f"this server has {limits.max_connections} open connections, its limit; "
                "retry on a new connection shortly"
            ),
            address_busy=(
                f"this server has {limits.max_connections} open connections, its limit, and "
                f"this client address holds its share of them ({limits.address_share:g}), all "
                "busy; retry on a new connection shortly"
            ),
            evicted=(
                f"this server has {limits.max_connections} open connections, its limit, and "
                "closed this one, whose request was the slowest to arrive, to make room; "
                "retry on a new connection"
            ),
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


def head_size(url: bytes, headers: Iterable[tuple[bytes, bytes]]) -> int:
    """A parsed request head's size on the wire (about: the request line's spacing and each
    header's separators are counted as the usual ones)."""
    size = len(url) + _REQUEST_LINE_EXTRA
    for name, value in headers:
        size += len(name) + len(value) + 4
    return size


class _Refusal(Exception):
    """Raised from a parser callback: stops the parser; data_received answers it."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def front_door_protocol(limits: FrontDoorLimits, stats: FrontDoorStats) -> type[FrontDoorProtocol]:
    """The protocol class for one server with `limits`, its refusals counted in `stats`; pass
    it as `uvicorn.Config(http=...)`, which builds one per connection."""
    attributes = {
        "_rules": DoorRules.from_limits(limits),
        "_stats": stats,
        "_table": ConnectionTable(limits.max_connections, limits.address_share),
    }
    return cast(
        type[FrontDoorProtocol], type("FrontDoorProtocol", (FrontDoorProtocol,), attributes)
    )


class FrontDoorProtocol(HttpToolsProtocol):
    """One client connection held to the server's limits. The limits are class attributes of
    a subclass per server (`front_door_protocol`): uvicorn builds connections from a class."""

    _rules: ClassVar[DoorRules]
    _stats: ClassVar[FrontDoorStats]
    _table: ClassVar[ConnectionTable[FrontDoorProtocol]]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn's Config takes whole seconds only.
        self.timeout_keep_alive = self._rules.keep_alive_timeout  # type: ignore[assignment]
        self._stats.connections = server_state.connections
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
        self._address: str | None = None  # the client's, once in the table
        self._opened_at = 0.0  # loop time; with _heads, what a header timeout reports
        self._heads = 0  # request heads received

    # --- connection ---

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        rules = self._rules
        table = self._table
        if len(self.connections) >= rules.max_connections:
            peer = get_remote_addr(transport)
            address = peer[0] if peer else ""
            if not table.make_room(address):
                # Refused before anything is set up: the descriptor is freed at once.
                self.transport = transport
                self._stopped = True
                transport.write(
                    error_response(
                        503,
                        rules.address_busy
                        if table.held_by(address) >= table.address_cap
                        else rules.busy,
                        type="service_unavailable",
                        default_headers=self.server_state.default_headers,
                        extra_headers=[(b"retry-after", b"1")],
                    )
                )
                transport.close()
                self._stats.refused("connection_limit")
                return
        super().connection_made(transport)
        client = self.client
        self._address = client[0] if client else ""
        table.opened(self, self._address)
        self._opened_at = self.loop.time()
        self._head_timer = self.loop.call_later(rules.header_timeout, self._header_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self._address is not None:
            self._table.closed(self, self._address)
        super().connection_lost(exc)

    # --- room in a full table (ConnectionTable) ---

    def door_state(self) -> DoorState:
        if self._stopped or self.transport.is_closing():
            return DoorState.GONE
        if self._reading_head:
            if not self._idle():
                return DoorState.BUSY
            return DoorState.HEAD if self._head_bytes else DoorState.IDLE
        if self.cycle.response_started or self.pipeline:
            # Answering it, or an earlier request (it waits, pipelined, behind that one).
            return DoorState.BUSY
        return DoorState.BODY

    def wait_mark(self) -> object:
        return self.cycle

    def evict(self, state: DoorState) -> None:
        self._refuse(
            503,
            f"evicted_{state.value}",
            self._rules.evicted,
            # As on a header timeout: an answer on a connection that has sent nothing would
            # be taken for the answer to the request its client is about to send.
            answer=state is not DoorState.IDLE,
            error_type="service_unavailable",
            extra_headers=[(b"retry-after", b"1")],
        )

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
                rules = self._rules
                if self._head_bytes > rules.max_header_bytes:
                    # Refused before the rest arrives: httptools would buffer all of it.
                    self._refuse(431, "header_too_large", rules.header_too_large)
                elif self._head_timer is None and self._idle():
                    self._head_timer = self.loop.call_later(
                        rules.header_timeout, self._header_timed_out
                    )
        else:
            rules = self._rules
            if self._body_bytes > rules.max_after_head:
                self._refuse(413, "body_too_large", rules.body_too_large)
            elif self._body_timer is None:
                self._body_timer = self.loop.call_later(rules.body_timeout, self._body_timed_out)

    # --- parser callbacks ---

    def on_headers_complete(self) -> None:
        rules = self._rules
        if len(self.headers) > rules.max_header_count:
            raise _Refusal(431, "too_many_headers", rules.too_many_headers)
        size = self._head_bytes
        if size == 0 or size + self._head_slack > rules.max_header_bytes:
            # Not known to fit (the head began inside a read, or its reads, a body perhaps
            # with them, may run over the limit): measure the head itself.
            size = head_size(self.url, self.headers)
        if size > rules.max_header_bytes:
            raise _Refusal(431, "header_too_large", rules.header_too_large)
        self._reading_head = False
        self._head_bytes = 0
        self._head_slack = 0
        self._body_bytes = 0
        self._heads += 1
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        _base_headers_complete(self)

    def on_message_complete(self) -> None:
        _base_message_complete(self)
        self._reading_head = True
        self._head_slack = self._read_len
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def on_response_complete(self) -> None:
        _base_response_complete(self)
        if self._head_bytes or self._deferred is not None:
            self._after_busy_response()

    # --- refusals ---

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "bad_request", msg)

    def _idle(self) -> bool:
        """No response is being sent or waiting to be (the newest request is answered)."""
        return self.cycle is None or self.cycle.response_complete

    def _refuse(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        answer: bool = True,
        error_type: str = "invalid_request_error",
        extra_headers: Iterable[tuple[bytes, bytes]] = (),
        detail: str = "",
    ) -> None:
        self._stopped = True
        self._cancel_timers()
        self._stats.refused(reason, detail)
        response = (
            error_response(
                status,
                message,
                type=error_type,
                default_headers=self.server_state.default_headers,
                extra_headers=extra_headers,
            )
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
            self._head_timer = self.loop.call_later(
                self._rules.header_timeout, self._header_timed_out
            )

    def _header_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._reading_head:
            return
        # A connection that never sent a byte gets no answer: a client that opened it for
        # a request it has yet to send would take an answer for that request's.
        self._refuse(
            408,
            "header_timeout",
            f"request headers not received within {self._rules.header_timeout:g} s",
            answer=self._head_bytes > 0,
            detail=(
                f"open {self.loop.time() - self._opened_at:.1f} s, {self._heads} request "
                f"head(s) before, {self._head_bytes} byte(s) of this one"
            ),
        )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self._reading_head:
            return
        body_timeout = self._rules.body_timeout
        if self.flow.read_paused:
            # The server stopped reading (the app has not taken the body so far, or
            # requests are queued ahead): the wait is not the client's.
            self._body_timer = self.loop.call_later(body_timeout, self._body_timed_out)
            return
        self._refuse(408, "body_timeout", f"request body not received within {body_timeout:g} s")

    def _cancel_timers(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
