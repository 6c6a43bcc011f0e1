"""A lean HTTP/1.1 client for forwarding requests to vLLM backends.

Hand-written on purpose: profiling showed aiohttp's client at ~46% of the proxy's CPU per
request, and what costs there is its generic machinery (tracing hooks, the cookie jar, a timer
per read, StreamReader, multidict headers, per-request timeout contexts), none of which a
forwarder needs. This client is an asyncio.Protocol over `httptools` (the C llhttp parser
uvicorn uses) with a keep-alive pool per backend origin, and does only what forwarding needs:

- one `request()` writes the request line, Host, Content-Length, the caller's headers and the
  body in a single write, and returns when the status line and headers are parsed;
- the body is framed by Content-Length, chunked encoding or the end of the connection, and is
  handed over as the parser produces it (`read()` or `async for`);
- the read timeout is the longest silence from the backend, kept with one self-re-arming timer
  per connection that is only pushed forward by a timestamp on each read;
- a consumer slower than the backend pauses the socket past a high-water mark;
- a response abandoned early (client gone, task cancelled) closes its socket, so the backend
  sees the disconnect and aborts the generation; only cleanly finished connections are reused.

Errors are `UpstreamError` with a `kind` that tells a retry policy whether anything was sent.

scripts/perf/bench_upstream_client.py measures it against aiohttp configured as the proxy did:
a non-streamed request costs ~14% of aiohttp's CPU. A streamed one costs about what a client
doing no HTTP work at all pays for its socket reads and task wake-ups (its --floor row).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Literal, Protocol, cast
from urllib.parse import urlsplit

import httptools

from proxy.errors import FailureKind

# What went wrong on the wire: this module's own vocabulary, for whoever reads a response.
UpstreamErrorKind = Literal["connect", "timeout", "disconnect", "protocol", "interrupted"]

# Flow control: pause the socket once this many body bytes wait for the consumer, resume when
# it has taken them down to the low mark. Large enough that token streams never pause.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024

# Connection states.
_IDLE = 0  # no request in flight
_HEAD = 1  # request sent, status line and headers not complete yet
_BODY = 2  # headers parsed, body arriving
_DONE = 3  # response complete (set inside the parser callbacks; handed back after feed_data)


class UpstreamError(Exception):
    """A backend failed to answer. `kind`: connect | timeout | disconnect | protocol, or
    interrupted (the consumer's own `interrupt()`, not the backend's doing).

    "connect" means nothing was sent, so any request may be retried elsewhere.
    """

    def __init__(self, kind: UpstreamErrorKind, message: str, *, timed_out: bool = False) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind: UpstreamErrorKind = kind
        # For "connect": the backend did not answer in time (busy?) rather than refusing.
        self.timed_out = timed_out


def failure_kind(e: UpstreamError) -> FailureKind:
    """What `e` says about the backend: only a refused connection says it is down."""
    if e.kind == "connect":
        return "connect_timeout" if e.timed_out else "connect"
    return "io"


class _Origin:
    """One backend's address and its idle keep-alive connections (LIFO). `host_header`: the
    Host value, followed by the pool's fixed header lines."""

    __slots__ = ("host", "host_header", "idle", "name", "port", "tls")

    def __init__(self, name: str, host: str, port: int, host_header: bytes, tls: bool) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.host_header = host_header
        self.tls = tls
        self.idle: list[_Connection] = []


def _parse_origin(origin: str) -> _Origin:
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"only http:// and https:// origins are supported, got {origin!r}")
    if not parts.hostname:
        raise ValueError(f"origin without a host: {origin!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"origin must be scheme://host[:port] only, got {origin!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    return _Origin(origin, parts.hostname, port, parts.netloc.encode("idna"), tls)


def split_url(url: str) -> tuple[str, str]:
    """A backend URL as (`scheme://host[:port]`, its path prefix without a trailing slash)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")


class UpstreamResponse:
    """A response whose status and headers have arrived; the body follows through it."""

    __slots__ = (
        "_complete",
        "_conn",
        "_error",
        "_pieces",
        "_released",
        "_size",
        "_waiter",
        "raw_headers",
        "status",
    )

    def __init__(self, conn: _Connection | None) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._conn: _Connection | None = conn  # None once the body is complete or abandoned
        self._pieces: deque[bytes] = deque()
        self._size = 0  # bytes in _pieces, for flow control
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._error: UpstreamError | None = None
        self._released = False

    @classmethod
    def complete(
        cls, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        """A response whose body has all arrived, with no connection behind it (what a
        stand-in `Upstream` answers)."""
        resp = cls(None)
        resp.status = status
        resp.raw_headers = headers
        resp._complete = True
        if body:
            resp._pieces.append(body)
        return resp

    async def _wait(self) -> None:
        """Until the connection has news (head, a piece, the end or an error)."""
        conn = self._conn
        assert conn is not None
        waiter = conn.loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        except asyncio.CancelledError:
            self.release()  # an abandoned half-read response must not be reused
            raise
        finally:
            self._waiter = None

    async def read(self) -> bytes:
        """The whole body (chunked framing removed)."""
        while not self._complete:
            if self._error is not None:
                raise self._error
            if self._released:
                raise RuntimeError("response body read after release()")
            # read() takes it all, so flow control would only stall it.
            self._size = 0
            conn = self._conn
            if conn is not None and conn.paused:
                conn.resume()
            await self._wait()
        return self._take_all()

    async def read_within(self, limit: int) -> bytes | None:
        """The whole body, as `read()`, when it completes within about `limit` bytes (past
        it by at most what one socket read brings); else None as soon as more has arrived,
        the bytes read so far left to `async for`, ahead of the rest, under flow control."""
        held = 0
        while not self._complete:
            if self._error is not None:
                raise self._error
            if self._released:
                raise RuntimeError("response body read after release()")
            # `_size` counts what arrived since the last look; zeroed, the socket never pauses.
            held += self._size
            if held > limit:
                self._size = held  # `async for` counts it down from here
                return None
            self._size = 0
            conn = self._conn
            if conn is not None and conn.paused:
                conn.resume()
            await self._wait()
        return self._take_all()

    async def read_start(self, limit: int) -> bytes:
        """The body's first bytes, `limit` or a little more (less when it is shorter), without
        waiting for the rest: what an error answer's detail needs of a body of any size."""
        whole = await self.read_within(limit)
        return whole if whole is not None else self._take_all()

    def _take_all(self) -> bytes:
        pieces = self._pieces
        if len(pieces) == 1:
            return pieces.pop()
        data = b"".join(pieces)
        pieces.clear()
        return data

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        pieces = self._pieces
        while not pieces:
            if self._complete:
                raise StopAsyncIteration
            if self._error is not None:
                raise self._error
            conn = self._conn
            if conn is None:
                raise RuntimeError("response body read after release()")
            # Inlined rather than `await self._wait()`: one coroutine less per wake-up.
            waiter = conn.loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            except asyncio.CancelledError:
                self._waiter = None
                self.release()
                raise
        # Everything already here goes out as one piece: a consumer that fell behind (or a
        # read that brought several chunks) relays them in one write, never waiting for more.
        if len(pieces) == 1:
            piece = pieces.popleft()
        else:
            piece = b"".join(pieces)
            pieces.clear()
        conn = self._conn
        if conn is not None:
            self._size -= len(piece)
            if conn.paused and self._size <= LOW_WATER:
                conn.resume()
        return piece

    @property
    def at_end(self) -> bool:
        """The body is complete and every piece of it was handed over."""
        return self._complete and not self._pieces

    @property
    def last_read(self) -> float:
        """Loop time of the last byte from the backend (or of sending the request); 0 once
        the body is complete."""
        conn = self._conn
        return conn.last_read if conn is not None else 0.0

    def set_read_timeout(self, seconds: float) -> None:
        """From now on, fail with "timeout" after this long without a byte from the backend
        (a stream past its first token can use a much shorter limit than a long prefill)."""
        conn = self._conn
        if conn is not None:
            conn.set_read_timeout(seconds)

    def interrupt(self, why: str) -> None:
        """Make the consumer's next wait end with UpstreamError("interrupted"): pieces already
        here are still handed over first, and a body that completes first just ends."""
        if self._complete or self._released or self._error is not None:
            return
        self._error = UpstreamError("interrupted", why)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def release(self) -> None:
        """Done with this response. Idempotent; closes the socket unless the body is complete.

        A finished body's connection went back to the pool as soon as it ended; an unfinished
        one is closed so the backend sees the client go away.
        """
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn is not None:
            conn.abandon()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class _Connection(asyncio.Protocol):
    """One keep-alive TCP connection: parses responses into the in-flight UpstreamResponse."""

    __slots__ = (
        "closed",
        "head_only",
        "keep_alive",
        "last_read",
        "loop",
        "origin",
        "parser",
        "paused",
        "pool",
        "read_timeout",
        "received",
        "response",
        "state",
        "timer",
        "transport",
    )

    def __init__(self, pool: UpstreamPool, origin: _Origin, loop: asyncio.AbstractEventLoop):
        self.pool = pool
        self.origin = origin
        self.loop = loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.response: UpstreamResponse | None = None
        self.state = _IDLE
        self.closed = False
        self.paused = False
        self.received = False  # any byte of the in-flight response arrived
        self.keep_alive = True
        self.head_only = False
        self.last_read = 0.0
        self.read_timeout = pool.read_timeout  # per response: see set_read_timeout
        self.timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses but have its methods.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Small writes must not wait for delayed ACKs (40 ms stalls). asyncio and uvloop
            # both set it today; said here so this client does not depend on that.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.state == _IDLE:
            self.close()  # bytes nobody asked for: the stream is out of step
            return
        self.received = True
        self.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self.state == _DONE:
                self.keep_alive = False  # junk after a complete response: finish, then close
            else:
                self.fail(UpstreamError("protocol", f"{self.origin.name}: bad response: {e}"))
                return
        if self.state == _DONE:
            self.finish()

    def eof_received(self) -> bool | None:
        resp = self.response
        if self.state == _BODY and resp is not None and _ends_at_close(resp.raw_headers):
            # A body without Content-Length or chunked framing ends with the connection.
            self.keep_alive = False
            self.finish()
        else:
            # Nothing more can come: a response in flight fails, and an idle connection
            # leaves the pool now rather than be picked by a request before connection_lost.
            self.fail(UpstreamError("disconnect", f"{self.origin.name}: backend closed"))
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        why = f"connection reset: {exc}" if exc is not None else "backend closed the connection"
        self.fail(UpstreamError("disconnect", f"{self.origin.name}: {why}"))

    # --- httptools callbacks

    def on_message_begin(self) -> None:
        if self.state != _HEAD:
            raise httptools.HttpParserError("response without a request")
        resp = self.response
        if resp is not None and resp.raw_headers:
            resp.raw_headers = []  # the headers were an interim 1xx response's

    def on_header(self, name: bytes, value: bytes) -> None:
        resp = self.response
        if resp is not None:
            resp.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            return  # an interim response (100 Continue): the real one follows
        resp = self.response
        assert resp is not None
        resp.status = status
        if self.head_only:
            # The parser cannot know a HEAD response has no body; end it here, and do not
            # reuse the connection since the parser would now expect one.
            self.state = _DONE
            self.keep_alive = False
        else:
            self.state = _BODY
        self.wake(resp)

    def on_body(self, body: bytes) -> None:
        resp = self.response
        assert resp is not None  # the parser only produces a body after headers
        resp._pieces.append(body)
        size = resp._size + len(body)
        resp._size = size
        if size > HIGH_WATER and not self.paused:
            self.pause()
        waiter = resp._waiter  # wake() inlined: this runs for every piece
        if waiter is not None:
            resp._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def on_message_complete(self) -> None:
        if self.state == _HEAD:
            return  # the end of an interim 1xx response
        self.keep_alive = self.keep_alive and self.parser.should_keep_alive()
        self.state = _DONE

    # --- the pool's side

    def send(self, data: bytes, head_only: bool) -> UpstreamResponse:
        resp = UpstreamResponse(self)
        self.response = resp
        self.state = _HEAD
        self.received = False
        self.head_only = head_only
        self.last_read = self.loop.time()
        if self.read_timeout != self.pool.read_timeout:
            self.set_read_timeout(self.pool.read_timeout)
        if self.timer is None:
            self.timer = self.loop.call_later(self.read_timeout, self.on_timer)
        transport = self.transport
        assert transport is not None
        transport.write(data)
        return resp

    def wake(self, resp: UpstreamResponse) -> None:
        waiter = resp._waiter
        if waiter is not None:
            resp._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def finish(self) -> None:
        """The in-flight response is complete: hand it over and pool or close the socket."""
        resp = self.response
        self.response = None
        self.state = _IDLE
        if resp is not None:
            resp._conn = None
            resp._complete = True
            self.wake(resp)
        if self.paused:
            self.resume()
        if self.keep_alive and not self.closed:
            self.pool.put_idle(self)
        else:
            self.close()

    def fail(self, error: UpstreamError) -> None:
        """End the in-flight response with `error` (if any) and close the socket."""
        resp = self.response
        self.response = None
        if resp is not None and not resp._complete:
            resp._conn = None
            resp._error = error
            self.wake(resp)
        self.close()

    def abandon(self) -> None:
        """The consumer stopped before the end: close so the backend aborts the request."""
        resp = self.response
        self.response = None
        if resp is not None:
            resp._conn = None
        if self.transport is not None:
            self.transport.abort()
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.state = _IDLE
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()
        self.pool.forget(self)

    def pause(self) -> None:
        self.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        self.paused = False
        self.last_read = self.loop.time()  # the silence while paused was ours, not the backend's
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def set_read_timeout(self, seconds: float) -> None:
        self.read_timeout = seconds
        if self.timer is not None:
            # The armed timer may be far later than the new limit: arm it again now.
            self.timer.cancel()
            self.timer = None
            if not self.closed and self.state != _IDLE:
                wait = max(0.0, seconds - (self.loop.time() - self.last_read))
                self.timer = self.loop.call_later(wait, self.on_timer)

    def on_timer(self) -> None:
        # One timer per busy connection, re-armed only when it fires: reads just stamp a time.
        self.timer = None
        if self.closed or self.state == _IDLE:
            return
        timeout = self.read_timeout
        silent = self.loop.time() - self.last_read
        if self.paused or silent < timeout:
            wait = timeout if self.paused else timeout - silent
            self.timer = self.loop.call_later(wait, self.on_timer)
            return
        self.fail(
            UpstreamError("timeout", f"{self.origin.name}: no response byte for {timeout:g}s")
        )


def _ends_at_close(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-length":
            return False
        if lname == b"transfer-encoding" and b"chunked" in value.lower():
            return False
    return True


class Upstream(Protocol):
    """What the proxy needs of its forwarding client: `UpstreamPool`, or a stand-in for it."""

    async def request(
        self,
        origin: str,
        path: str | bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        method: bytes = b"POST",
        on_sent: Callable[[UpstreamResponse], None] | None = None,
    ) -> UpstreamResponse: ...

    def retain_origins(self, keep: set[str]) -> None: ...

    async def close(self) -> None: ...


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to any number of backend origins."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_idle_per_origin: int = 256,
        ssl_context: ssl.SSLContext | None = None,
        fixed_headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """`fixed_headers` go on every request to every origin (a backend API key): encoded
        once per origin, after Host, so they cost nothing per request."""
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle_per_origin = max_idle_per_origin
        # For https:// backends; built on first use (loading the CA store costs milliseconds).
        self._ssl_context = ssl_context
        self._fixed_head = b"".join(b"\r\n" + n + b": " + v for n, v in fixed_headers)
        self._origins: dict[str, _Origin] = {}
        self._conns: set[_Connection] = set()  # every open connection, idle or busy
        self._closed = False

    async def request(
        self,
        origin: str,
        path: str | bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        method: bytes = b"POST",
        on_sent: Callable[[UpstreamResponse], None] | None = None,
    ) -> UpstreamResponse:
        """Send one request; return once the response's status line and headers are parsed.

        `on_sent` gets the response as soon as the request is written, before its head has
        arrived, so that the caller can `interrupt()` a wait for a backend found down.

        `headers` are end-to-end headers only: Host and Content-Length are written here, and
        hop-by-hop ones (Connection, Transfer-Encoding, Keep-Alive...) must not be passed.
        """
        if self._closed:
            raise RuntimeError("UpstreamPool is closed")
        o = self._origins.get(origin)
        if o is None:
            o = self._origins[origin] = _parse_origin(origin)
            o.host_header += self._fixed_head
        data = _encode(method, path, o.host_header, headers, body)
        head_only = method == b"HEAD"
        idle = o.idle
        if idle:
            conn = idle.pop()
            try:
                return await _exchange(conn, data, head_only, on_sent)
            except UpstreamError as e:
                # A reused connection the backend closed while idle fails before any byte of
                # the response: the classic keep-alive race. Once more on a fresh connection.
                if e.kind != "disconnect" or conn.received or self._closed:
                    raise
        conn = await self._connect(o)
        return await _exchange(conn, data, head_only, on_sent)

    async def _connect(self, o: _Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if o.tls:
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            tls = self._ssl_context
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, o, loop),
                    o.host,
                    o.port,
                    ssl=tls,
                    server_hostname=o.host if tls is not None else None,
                )
        except TimeoutError:
            raise UpstreamError(
                "connect",
                f"{o.name}: connect timed out after {self.connect_timeout:g}s",
                timed_out=True,
            ) from None
        except OSError as e:
            raise UpstreamError("connect", f"{o.name}: {e}") from None
        if self._closed:
            conn.close()
            raise RuntimeError("UpstreamPool is closed")
        self._conns.add(conn)
        return conn

    def put_idle(self, conn: _Connection) -> None:
        idle = conn.origin.idle
        if self._closed or len(idle) >= self.max_idle_per_origin:
            conn.close()
        else:
            idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        self._conns.discard(conn)
        idle = conn.origin.idle
        if conn in idle:
            idle.remove(conn)

    def origins(self) -> list[str]:
        """The origins this pool has talked to and still keeps."""
        return list(self._origins)

    def retain_origins(self, keep: set[str]) -> None:
        """Forget every other origin, closing its idle connections (a removed backend's
        connections would otherwise hold a file descriptor each until it closes them)."""
        for name in [n for n in self._origins if n not in keep]:
            origin = self._origins.pop(name)
            for conn in list(origin.idle):
                conn.close()
            origin.idle.clear()

    async def close(self) -> None:
        """Close every connection, idle or busy; in-flight responses fail with "disconnect"."""
        self._closed = True
        for conn in list(self._conns):
            conn.fail(UpstreamError("disconnect", f"{conn.origin.name}: client pool closed"))
        for o in self._origins.values():
            o.idle.clear()
        await asyncio.sleep(0)  # let the transports run connection_lost


async def _exchange(
    conn: _Connection,
    data: bytes,
    head_only: bool,
    on_sent: Callable[[UpstreamResponse], None] | None,
) -> UpstreamResponse:
    resp = conn.send(data, head_only)
    if on_sent is not None:
        on_sent(resp)
    try:
        while resp.status == 0:
            if resp._error is not None:
                raise resp._error
            await resp._wait()
    except BaseException:
        resp.release()
        raise
    return resp


def _encode(
    method: bytes,
    path: str | bytes,
    host: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
) -> bytes:
    parts = [
        method,
        b" ",
        path if isinstance(path, bytes) else path.encode("latin-1"),
        b" HTTP/1.1\r\nHost: ",
        host,
    ]
    if body or method not in (b"GET", b"HEAD"):
        parts.append(b"\r\nContent-Length: %d" % len(body))
    for name, value in headers:
        parts += (b"\r\n", name, b": ", value)
    parts += (b"\r\n\r\n", body)
    return b"".join(parts)
