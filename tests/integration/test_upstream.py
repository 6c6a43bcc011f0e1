"""proxy.backends.upstream against tiny raw asyncio servers on 127.0.0.1 that write exact bytes.

Every test runs on both the default asyncio loop and uvloop (the proxy runs on uvloop).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trustme
import uvloop

from proxy.backends.upstream import UpstreamError, UpstreamPool
from tests.support.polling import eventually
from tests.support.sockets import unanswering_listener

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


# pytest-asyncio 1.x would have this as a pytest_asyncio_loop_factories hook, which only a
# conftest.py can hold; the fixture still works and keeps the choice within this module.
pytestmark = pytest.mark.filterwarnings('ignore:Overriding the "event_loop_policy" fixture')


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    if request.param == "uvloop":
        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


class Server:
    """Runs `handler` per accepted connection and counts the connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body) as received
        self.tasks: set[asyncio.Task[None]] = set()
        self.origin = ""
        self._server: asyncio.Server | None = None

    async def start(self, tls: ssl.SSLContext | None = None) -> Server:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=tls)
        port = self._server.sockets[0].getsockname()[1]
        self.origin = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request's head (recorded with its body); None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length)
        self.requests.append((head, body))
        return head

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(handler: Handler) -> Server:
        server = await Server(handler).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    p = UpstreamPool(connect_timeout=2.0, read_timeout=5.0)
    yield p
    await p.close()


def fixed(status_line: bytes, headers: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\n%s\r\n%s" % (status_line, headers, body)


def ok(body: bytes) -> bytes:
    return fixed(b"200 OK", b"Content-Length: %d\r\n" % len(body), body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def wait_for_eof(reader: asyncio.StreamReader) -> bool:
    """True once the peer closed or reset; bounded so a failure cannot hang the suite."""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(5):
            while await reader.read(65536):
                pass
    return True


def keep_answering(response: bytes) -> Callable[[Server], Handler]:
    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await server.read_request(reader) is not None:
                writer.write(response)
                await writer.drain()

        return handler

    return make


async def serve_with(
    serve: Callable[[Handler], Awaitable[Server]], make: Callable[[Server], Handler]
) -> Server:
    """A server whose handler can see the Server (for read_request and its records)."""
    box: list[Server] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await make(box[0])(reader, writer)

    server = await serve(handler)
    box.append(server)
    return server


async def test_content_length_body_and_the_request_as_sent(serve, pool) -> None:
    server = await serve_with(
        serve,
        keep_answering(
            fixed(b"200 OK", b"Content-Length: 5\r\nX-Backend-Thing: Yes\r\n", b"hello")
        ),
    )
    async with await pool.request(
        server.origin,
        "/v1/completions",
        [(b"content-type", b"application/json"), (b"X-Request-Id", b"r1")],
        b'{"a":1}',
    ) as resp:
        assert resp.status == 200
        assert resp.raw_headers == [(b"Content-Length", b"5"), (b"X-Backend-Thing", b"Yes")]
        assert await resp.read() == b"hello"
    head, body = server.requests[0]
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/completions HTTP/1.1"
    port = server.origin.rsplit(":", 1)[1].encode()
    assert b"Host: 127.0.0.1:" + port in lines
    assert b"Content-Length: 7" in lines
    assert b"content-type: application/json" in lines
    assert b"X-Request-Id: r1" in lines
    assert body == b'{"a":1}'


async def test_chunked_pieces_arrive_while_the_server_still_holds_the_rest(serve, pool) -> None:
    release_rest = asyncio.Event()
    rest = [b"piece-%d|" % i for i in range(40)]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(chunk(b"first"))
        await writer.drain()
        await release_rest.wait()
        for piece in rest:
            encoded = chunk(piece)
            for i in range(0, len(encoded), 3):  # many small writes, splitting the framing
                writer.write(encoded[i : i + 3])
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = await serve(handler)
    async with await pool.request(server.origin, "/stream", [], b"{}") as resp:
        pieces = aiter(resp)
        assert await anext(pieces) == b"first"
        assert not release_rest.is_set()  # the server has not sent anything else yet
        release_rest.set()
        got = [piece async for piece in pieces]
    assert b"".join(got) == b"".join(rest)
    assert len(got) > 1  # handed over as they came, not gathered at the end


async def test_body_read_until_the_server_closes(serve, pool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        for i in range(5):
            writer.write(b"part%d;" % i)
            await writer.drain()
        writer.close()

    server = await serve(handler)
    async with await pool.request(server.origin, "/", [], b"") as resp:
        assert await resp.read() == b"part0;part1;part2;part3;part4;"


async def test_sequential_requests_reuse_one_connection(serve, pool) -> None:
    server = await serve_with(serve, keep_answering(ok(b"fine")))
    for _ in range(3):
        async with await pool.request(server.origin, "/", [], b"x") as resp:
            assert await resp.read() == b"fine"
    assert server.accepted == 1
    assert len(server.requests) == 3


async def test_a_response_with_connection_close_is_not_reused(serve, pool) -> None:
    # The server would answer more on the same socket: the client must not ask it to.
    response = fixed(b"200 OK", b"Content-Length: 2\r\nConnection: close\r\n", b"ok")
    server = await serve_with(serve, keep_answering(response))
    for _ in range(2):
        async with await pool.request(server.origin, "/", [], b"") as resp:
            assert await resp.read() == b"ok"
    assert server.accepted == 2


async def test_idle_connection_closed_by_the_server_is_replaced(serve, pool) -> None:
    closed = asyncio.Event()

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(ok(b"one"))
            await writer.drain()
            writer.close()  # keep-alive promised, then closed while idle
            await writer.wait_closed()
            closed.set()

        return handler

    server = await serve_with(serve, make)
    for _ in range(2):
        async with await pool.request(server.origin, "/", [], b"") as resp:
            assert await resp.read() == b"one"
        await closed.wait()
    assert server.accepted == 2


async def test_stale_keep_alive_race_is_retried_once_on_a_fresh_connection(serve, pool) -> None:
    # The backend closes a kept-alive connection just as the next request arrives on it,
    # without answering: the request goes again on a new connection.
    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(ok(b"answer%d" % server.accepted))
            await writer.drain()
            if server.accepted == 1:
                await server.read_request(reader)  # then close without a byte
                return
            while await server.read_request(reader) is not None:
                writer.write(ok(b"later"))

        return handler

    server = await serve_with(serve, make)
    async with await pool.request(server.origin, "/", [], b"") as resp:
        assert await resp.read() == b"answer1"
    async with await pool.request(server.origin, "/", [], b"second") as resp:
        assert await resp.read() == b"answer2"
    assert server.accepted == 2
    assert [body for _, body in server.requests] == [b"", b"second", b"second"]


async def test_connect_refused_is_kind_connect(pool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UpstreamError) as err:
        await pool.request(f"http://127.0.0.1:{port}", "/", [], b"")
    assert err.value.kind == "connect"


async def test_silence_before_the_head_is_a_timeout(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.read()  # never answers

    server = await serve(handler)
    pool = UpstreamPool(connect_timeout=2.0, read_timeout=0.2)
    try:
        with pytest.raises(UpstreamError) as err:
            async with asyncio.timeout(5):  # bounds the test if the read timeout is broken
                await pool.request(server.origin, "/", [], b"")
        assert err.value.kind == "timeout"
    finally:
        await pool.close()


async def test_silence_mid_stream_is_a_timeout_and_closes_the_socket(serve) -> None:
    saw_eof = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"a"))
        await writer.drain()
        if await wait_for_eof(reader):
            saw_eof.set()

    server = await serve(handler)
    pool = UpstreamPool(connect_timeout=2.0, read_timeout=0.2)
    try:
        resp = await pool.request(server.origin, "/", [], b"")
        got = []
        with pytest.raises(UpstreamError) as err:
            async with asyncio.timeout(5):
                async for piece in resp:
                    got.append(piece)
        assert got == [b"a"]
        assert err.value.kind == "timeout"
        await asyncio.wait_for(saw_eof.wait(), 5)
    finally:
        await pool.close()


async def test_server_dropping_mid_body_is_a_disconnect(serve, pool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..")
        await writer.drain()

    server = await serve(handler)
    resp = await pool.request(server.origin, "/", [], b"")
    with pytest.raises(UpstreamError) as err:
        await resp.read()
    assert err.value.kind == "disconnect"


async def test_server_dropping_mid_chunked_stream_is_a_disconnect(serve, pool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(chunk(b"one") + chunk(b"two"))
        await writer.drain()

    server = await serve(handler)
    resp = await pool.request(server.origin, "/", [], b"")
    got = []
    with pytest.raises(UpstreamError) as err:
        async for piece in resp:
            got.append(piece)
    assert b"".join(got) == b"onetwo"
    assert err.value.kind == "disconnect"


def holds_a_stream(saw_eof: asyncio.Event, *, head: bool = True) -> Handler:
    """Sends the head and one piece (or nothing), then waits for the client to go away."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if head:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(chunk(b"token"))
            await writer.drain()
        if await wait_for_eof(reader):
            saw_eof.set()

    return handler


async def test_release_mid_stream_closes_the_socket(serve, pool) -> None:
    saw_eof = asyncio.Event()
    server = await serve(holds_a_stream(saw_eof))
    resp = await pool.request(server.origin, "/", [], b"")
    assert await anext(aiter(resp)) == b"token"
    resp.release()
    resp.release()  # idempotent
    await asyncio.wait_for(saw_eof.wait(), 5)
    # and the next request does not get that connection
    saw_eof.clear()
    resp = await pool.request(server.origin, "/", [], b"")
    resp.release()
    assert server.accepted == 2


async def test_cancelling_a_reader_closes_the_socket(serve, pool) -> None:
    saw_eof = asyncio.Event()
    server = await serve(holds_a_stream(saw_eof))
    first = asyncio.Event()

    async def consume() -> None:
        resp = await pool.request(server.origin, "/", [], b"")
        async for _ in resp:
            first.set()

    task = asyncio.create_task(consume())
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(saw_eof.wait(), 5)


async def test_cancelling_while_waiting_for_the_head_closes_the_socket(serve, pool) -> None:
    saw_eof = asyncio.Event()
    server = await serve(holds_a_stream(saw_eof, head=False))
    task = asyncio.create_task(pool.request(server.origin, "/", [], b""))
    await eventually(lambda: server.accepted, what="the connection accepted")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(saw_eof.wait(), 5)


async def test_slow_consumer_of_a_large_fast_body_pauses_the_backend_and_loses_nothing(
    serve, pool
) -> None:
    pieces = [hashlib.sha256(b"%d" % i).digest() * 2048 for i in range(768)]  # 64 KiB each
    expected = hashlib.sha256(b"".join(pieces)).hexdigest()
    all_written = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            writer.write(chunk(piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        all_written.set()
        await reader.read()

    server = await serve(handler)
    async with await pool.request(server.origin, "/", [], b"") as resp:
        it = aiter(resp)
        digest = hashlib.sha256(await anext(it))
        # The client holds 48 MiB back: unless it stops reading the socket, the backend can
        # write it all into the client's buffers at loopback speed.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_written.wait(), 0.5)
        assert not all_written.is_set()
        total = 0
        async for piece in it:
            digest.update(piece)
            total += 1
            if total % 64 == 0:
                await asyncio.sleep(0.001)  # still slower than the backend
    assert digest.hexdigest() == expected
    assert all_written.is_set()


async def test_garbage_is_a_protocol_error(serve, pool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = await serve(handler)
    with pytest.raises(UpstreamError) as err:
        await pool.request(server.origin, "/", [], b"")
    assert err.value.kind == "protocol"


async def test_204_has_no_body_and_keeps_the_connection(serve, pool) -> None:
    server = await serve_with(serve, keep_answering(b"HTTP/1.1 204 No Content\r\n\r\n"))
    for _ in range(2):
        async with await pool.request(server.origin, "/", [], b"") as resp:
            assert resp.status == 204
            assert await resp.read() == b""
    assert server.accepted == 1


async def test_interim_100_continue_is_skipped(serve, pool) -> None:
    response = b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\n" + ok(b"final")
    server = await serve_with(serve, keep_answering(response))
    async with await pool.request(server.origin, "/", [], b"") as resp:
        assert resp.status == 200
        assert resp.raw_headers == [(b"Content-Length", b"5")]
        assert await resp.read() == b"final"


async def test_get_sends_no_content_length_and_iterates_a_plain_body(serve, pool) -> None:
    server = await serve_with(serve, keep_answering(ok(b"metrics here")))
    async with await pool.request(server.origin, "/metrics", [], b"", method=b"GET") as resp:
        assert b"".join([piece async for piece in resp]) == b"metrics here"
    head, _ = server.requests[0]
    assert head.startswith(b"GET /metrics HTTP/1.1\r\n")
    assert b"content-length" not in head.lower()


async def test_closing_the_pool_fails_a_response_in_flight(serve) -> None:
    saw_eof = asyncio.Event()
    server = await serve(holds_a_stream(saw_eof))
    pool = UpstreamPool(connect_timeout=2.0, read_timeout=5.0)
    resp = await pool.request(server.origin, "/", [], b"")
    await pool.close()
    with pytest.raises(UpstreamError) as err:
        await resp.read()
    assert err.value.kind == "disconnect"
    await asyncio.wait_for(saw_eof.wait(), 5)
    with pytest.raises(RuntimeError):
        await pool.request(server.origin, "/", [], b"")


async def test_only_http_and_https_origins_without_a_path(pool) -> None:
    for origin in ("ftp://127.0.0.1:1", "http://127.0.0.1:1/v1", "127.0.0.1:1"):
        with pytest.raises(ValueError):
            await pool.request(origin, "/", [], b"")


async def test_read_of_a_large_body_is_not_stalled_by_flow_control(serve, pool) -> None:
    pieces = [bytes([i % 251]) * 65536 for i in range(256)]  # 16 MiB, far past the high mark

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            writer.write(chunk(piece))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = await serve(handler)
    async with await pool.request(server.origin, "/", [], b"") as resp:
        async with asyncio.timeout(10):
            assert await resp.read() == b"".join(pieces)


async def test_idle_connections_beyond_the_limit_are_closed(serve) -> None:
    gate = asyncio.Event()
    eofs = 0

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal eofs
            while await server.read_request(reader) is not None:
                await gate.wait()
                writer.write(ok(b"done"))
                await writer.drain()
            eofs += 1

        return handler

    server = await serve_with(serve, make)
    pool = UpstreamPool(connect_timeout=2.0, read_timeout=5.0, max_idle_per_origin=1)
    try:

        async def one() -> bytes:
            async with await pool.request(server.origin, "/", [], b"") as resp:
                return await resp.read()

        both = asyncio.gather(one(), one())  # two at once: two connections
        await eventually(lambda: len(server.requests) >= 2, what="both requests at the server")
        gate.set()
        assert await both == [b"done", b"done"]
        # One of them is not kept.
        await eventually(lambda: eofs >= 1, within=5, what="one connection closed")
        assert await one() == b"done"
        assert server.accepted == 2
        assert eofs == 1
    finally:
        await pool.close()


async def test_https_origin_with_a_trusted_certificate() -> None:
    """https:// backends work over TLS, verified against the CA the pool is given."""
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await server.read_request(reader) is not None:
            writer.write(fixed(b"200 OK", b"Content-Length: 6\r\n", b"secure"))

    server = await Server(answer).start(tls=server_tls)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    pool = UpstreamPool(connect_timeout=2.0, read_timeout=5.0, ssl_context=trusting)
    stranger = UpstreamPool(connect_timeout=2.0, read_timeout=5.0)  # the system CAs only
    try:
        for _ in range(2):
            async with await pool.request(server.origin, "/v1/x", [], b"{}") as resp:
                assert resp.status == 200
                assert await resp.read() == b"secure"
        assert server.accepted == 1  # kept alive over TLS too
        with pytest.raises(UpstreamError) as err:
            await stranger.request(server.origin, "/v1/x", [], b"{}")
        assert err.value.kind == "connect" and not err.value.timed_out
    finally:
        await pool.close()
        await stranger.close()
        await server.close()


async def test_connect_timeout_is_kind_connect_and_says_it_timed_out() -> None:
    """A port whose accept queue is full drops SYNs: the connect times out, not refused."""
    pool = UpstreamPool(connect_timeout=0.3, read_timeout=5.0)
    try:
        with unanswering_listener() as origin, pytest.raises(UpstreamError) as err:
            await pool.request(origin, "/", [], b"")
        assert err.value.kind == "connect" and err.value.timed_out
    finally:
        await pool.close()


async def test_pieces_already_received_come_out_as_one(serve, pool) -> None:
    """Ten chunks in one write reach the reader as one piece, and at_end says it was the last."""
    events = [b"data: %d\n\n" % i for i in range(10)]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        framed = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"
        )
        await writer.drain()
        await reader.read()

    server = await serve(handler)
    async with await pool.request(server.origin, "/", [], b"{}") as resp:
        assert not resp.at_end
        pieces = [piece async for piece in resp]
        assert resp.at_end
    assert b"".join(pieces) == b"".join(events)
    assert len(pieces) < len(events)


async def test_read_within_a_limit_hands_a_larger_body_over_to_iteration(serve, pool) -> None:
    pieces = [hashlib.sha256(b"%d" % i).digest() * 2048 for i in range(768)]  # 48 MiB
    body = b"".join(pieces)
    all_written = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            if all_written.is_set():  # the second request: a small body
                writer.write(ok(b"small"))
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
            all_written.set()

    server = await serve(handler)
    async with await pool.request(server.origin, "/", [], b"") as resp:
        assert await resp.read_within(1024 * 1024) is None
        # Past the limit flow control holds the backend back again, as for `async for`.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_written.wait(), 0.5)
        assert not all_written.is_set()
        got = bytearray()
        async for piece in resp:
            got.extend(piece)
        assert got == body  # what was read before the limit first, nothing lost
    async with await pool.request(server.origin, "/", [], b"") as resp:
        assert await resp.read_within(1024 * 1024) == b"small"
