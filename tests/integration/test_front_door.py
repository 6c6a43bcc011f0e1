"""The proxy's client-facing HTTP server (proxy/serving/front_door.py) probed on real sockets: header
limits, timeouts before a request is complete, the connection cap, malformed requests; and
ordinary requests still served as before."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import httptools
import httpx
import pytest

from proxy.serving.app import FleetProxyApp
from tests.support.fake_backend import Behaviour
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

COMPLETION = b'{"model": "fake-model", "prompt": "hi", "max_tokens": 4}'


@dataclass
class Response:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"] == "application/json"
        err = json.loads(self.body)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["param"] is None
        assert err["code"] == self.status
        return dict(err)


class RawClient:
    """One client connection on a plain non-blocking socket, driven by the test's loop (which
    the proxy shares), its responses parsed with httptools."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpResponseParser(self)
        self.responses: list[Response] = []
        self.closed = False  # the server closed (or reset) the connection
        self._current = Response()
        self._taken = 0

    @classmethod
    async def connect(cls, url: str, source: str | None = None) -> RawClient:
        """A connection to `url`, from the loopback address `source` when given."""
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setblocking(False)
        if source is not None:
            sock.bind((source, 0))
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        return cls(sock)

    def answered_or_closed(self) -> bool:
        """Whether the server has sent something or closed the connection, without waiting."""
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            pass
        return True

    async def head_received(self, within: float = 10.0) -> Response:
        """The head of the next response, its body perhaps still to come."""

        async def read() -> None:
            while not self._current.status and not self.closed:
                await self._read_once()

        await asyncio.wait_for(read(), within)
        return self._current

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._current = Response()

    def on_headers_complete(self) -> None:
        self._current.status = self.parser.get_status_code()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._current.headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._current.body += body

    def on_message_complete(self) -> None:
        self._current.status = self.parser.get_status_code()
        self.responses.append(self._current)

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def _read_once(self) -> None:
        try:
            data = await self.loop.sock_recv(self.sock, 65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
            return
        self.parser.feed_data(data)

    async def response(self, within: float = 10.0) -> Response:
        """The next response not yet taken."""
        want = self._taken + 1

        async def read() -> None:
            while len(self.responses) < want and not self.closed:
                await self._read_once()

        await asyncio.wait_for(read(), within)
        assert len(self.responses) >= want, "connection closed before a response"
        self._taken = want
        return self.responses[want - 1]

    async def until_closed_or_complete(self, within: float = 30.0) -> list[Response]:
        """Every response until the first is complete or the server closes the connection."""

        async def read() -> None:
            while not self.responses and not self.closed:
                await self._read_once()

        await asyncio.wait_for(read(), within)
        return self.responses

    async def until_closed(self, within: float = 10.0) -> list[Response]:
        """Every response until the server closes the connection."""

        async def read() -> None:
            while not self.closed:
                await self._read_once()

        await asyncio.wait_for(read(), within)
        return self.responses

    def close(self) -> None:
        self.sock.close()


def refused(app: FleetProxyApp, reason: str) -> float:
    value = app.core.prom.get_sample_value(
        "fleet_proxy_client_connections_refused_total", {"reason": reason}
    )
    return value or 0.0


def open_connections(app: FleetProxyApp) -> float:
    return app.core.prom.get_sample_value("fleet_proxy_client_connections") or 0.0


def request(method: str, path: str, body: bytes = b"", *extra: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: proxy", *extra]
    if body or method == "POST":
        lines += ["content-type: application/json", f"content-length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def test_ordinary_requests_streamed_plain_and_pipelined(backend):
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _app),
        httpx.AsyncClient(base_url=url) as c,
    ):
        r = await c.post("/v1/completions", content=COMPLETION)
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"].startswith("t0")
        body = {"model": "fake-model", "prompt": "hi", "max_tokens": 4, "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as s:
            events = [line async for line in s.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) == 9

        # Three requests in one write on one connection, answered in order, which stays open.
        raw = await RawClient.connect(url)
        try:
            await raw.send(
                request("GET", "/health")
                + request("POST", "/v1/completions", COMPLETION)
                + request("GET", "/v1/models")
            )
            first, second, third = [await raw.response() for _ in range(3)]
            assert (first.status, json.loads(first.body)) == (200, {"status": "ok"})
            assert second.status == 200 and json.loads(second.body)["choices"]
            assert json.loads(third.body)["data"][0]["id"] == "fake-model"
            await raw.send(request("GET", "/health"))
            assert (await raw.response()).status == 200
            assert not raw.closed
        finally:
            raw.close()


async def test_5000_headers_get_431(backend):
    async with running_proxy(fast_settings([backend.url])) as (url, app):
        raw = await RawClient.connect(url)
        try:
            headers = [f"x-h{i}: 1" for i in range(5000)]  # ~50 KB: under the byte limit
            await raw.send(request("POST", "/v1/completions", COMPLETION, *headers))
            [r] = await raw.until_closed()
        finally:
            raw.close()
        assert r.status == 431
        assert r.headers["connection"] == "close"
        err = r.error()
        assert err["type"] == "invalid_request_error"
        assert "more than 100 request headers" in err["message"]
        assert refused(app, "too_many_headers") == 1
        assert backend.seen == []


async def test_one_endless_header_is_refused_before_it_is_all_sent(backend):
    async with running_proxy(fast_settings([backend.url])) as (url, app):
        raw = await RawClient.connect(url)
        sent = 0
        total = 50 * 1024 * 1024
        chunk = b"a" * 65536

        async def pump() -> None:
            nonlocal sent
            await raw.send(b"GET /health HTTP/1.1\r\nhost: proxy\r\nx-big: ")
            while sent < total:
                await raw.send(chunk)
                sent += len(chunk)

        try:
            # The server stops reading and closes: the sending fails, or (the socket buffers
            # being larger than what is left) the whole lot goes and its answer is read.
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                await asyncio.wait_for(pump(), 30)
            [r] = await raw.until_closed()
        finally:
            raw.close()
        assert sent < total
        assert r.status == 431
        assert "65536-byte limit" in r.error()["message"]
        assert refused(app, "header_too_large") == 1


@pytest.mark.parametrize("pipelined", [False, True], ids=["first", "after-another"])
async def test_large_head_in_one_read_gets_431(backend, pipelined):
    settings = fast_settings([backend.url], client_max_header_bytes=4096)
    async with running_proxy(settings) as (url, app):
        raw = await RawClient.connect(url)
        try:
            big = request("GET", "/health", b"", *[f"x-h{i}: {'v' * 90}" for i in range(60)])
            assert 4096 < len(big) < 65536  # one write, one read on loopback
            await raw.send((request("GET", "/health") if pipelined else b"") + big)
            responses = await raw.until_closed()
        finally:
            raw.close()
        assert [r.status for r in responses] == ([200, 431] if pipelined else [431])
        assert "4096-byte limit" in responses[-1].error()["message"]
        assert refused(app, "header_too_large") == 1


async def test_large_head_begun_in_the_read_that_ended_a_request_gets_431(backend):
    settings = fast_settings([backend.url], client_max_header_bytes=4096)
    async with running_proxy(settings) as (url, app):
        raw = await RawClient.connect(url)
        try:
            big = request("GET", "/health", b"", *[f"x-h{i}: {'v' * 90}" for i in range(60)])
            # One request and 3,000 bytes of the next in one write, the rest once the first
            # is answered: each part under the limit, the head over it.
            await raw.send(request("GET", "/health") + big[:3000])
            assert (await raw.response()).status == 200
            await raw.send(big[3000:])
            responses = await raw.until_closed()
        finally:
            raw.close()
        assert [r.status for r in responses] == [200, 431]
        assert refused(app, "header_too_large") == 1


async def test_headers_dribbled_get_408_after_the_header_timeout(backend):
    settings = fast_settings([backend.url], client_header_timeout=1.0)
    async with running_proxy(settings) as (url, app):
        raw = await RawClient.connect(url)
        opened = time.monotonic()

        async def dribble() -> None:
            with_headers = b"GET /health HTTP/1.1\r\nhost: proxy\r\nx-slow: " + b"a" * 1000
            for byte in with_headers:
                await raw.send(bytes([byte]))
                await asyncio.sleep(0.2)

        dribbler = asyncio.create_task(dribble())
        try:
            [r] = await raw.until_closed()
        finally:
            dribbler.cancel()
            raw.close()
        assert time.monotonic() - opened >= 0.8
        assert r.status == 408
        assert "request headers not received within 1 s" in r.error()["message"]
        assert refused(app, "header_timeout") == 1


async def test_next_request_on_a_kept_connection_has_its_header_timeout_from_its_first_byte(
    backend, caplog
):
    settings = fast_settings(
        [backend.url], client_header_timeout=1.0, client_keep_alive_timeout=30.0
    )
    caplog.set_level(logging.WARNING, logger="fleet_proxy.front_door")
    async with running_proxy(settings) as (url, app):
        raw = await RawClient.connect(url)
        dribbler = None
        try:
            await raw.send(request("GET", "/health"))
            assert (await raw.response()).status == 200
            # Idle for longer than the header timeout: between requests the keep-alive wait
            # applies, so the connection stays open.
            await asyncio.sleep(1.5)
            first_byte = time.monotonic()

            async def dribble() -> None:
                for byte in b"GET /health HTTP/1.1\r\nhost: proxy\r\n" + b"x" * 100:
                    await raw.send(bytes([byte]))
                    await asyncio.sleep(0.2)

            dribbler = asyncio.create_task(dribble())
            responses = await raw.until_closed()
        finally:
            if dribbler is not None:
                dribbler.cancel()
            raw.close()
        assert [r.status for r in responses] == [200, 408]
        assert time.monotonic() - first_byte >= 0.8
        assert refused(app, "header_timeout") == 1
    # The report says what the connection had done: one request, then part of a head.
    report = "\n".join(r.getMessage() for r in caplog.records)
    assert re.search(
        r"last header_timeout: open \d+\.\d s, 1 request head\(s\) before, [1-9]\d* byte\(s\) "
        "of this one",
        report,
    ), report


async def test_body_dribbled_gets_408_and_the_app_sees_a_disconnect(backend):
    settings = fast_settings([backend.url], client_body_timeout=1.0)
    async with running_proxy(settings) as (url, app):
        raw = await RawClient.connect(url)

        async def dribble() -> None:
            head = request("POST", "/v1/completions", b" " * 200)[:-200]
            await raw.send(head)
            for byte in COMPLETION:
                await raw.send(bytes([byte]))
                await asyncio.sleep(0.2)

        dribbler = asyncio.create_task(dribble())
        try:
            responses = await raw.until_closed()
        finally:
            dribbler.cancel()
            raw.close()
        # One answer only: the app's own (to the disconnect it was told of) is not written.
        [r] = responses
        assert r.status == 408
        assert "request body not received within 1 s" in r.error()["message"]
        assert refused(app, "body_timeout") == 1
        # The proxy's handler got http.disconnect while reading the body.
        await eventually(
            lambda: (
                app.core.prom.get_sample_value(
                    "fleet_proxy_requests_total",
                    {"endpoint": "completions", "model": "unknown", "status": "499"},
                )
                == 1
            )
        )
        assert backend.seen == []


async def test_body_still_dribbling_after_an_early_answer_is_cut_off(backend):
    settings = fast_settings([backend.url], client_body_timeout=1.0, max_body_bytes=1000)
    async with running_proxy(settings) as (url, app):
        raw = await RawClient.connect(url)

        async def dribble() -> None:
            await raw.send(request("POST", "/v1/completions", b" " * 5000)[:-5000])
            while True:
                await raw.send(b" ")
                await asyncio.sleep(0.2)

        dribbler = asyncio.create_task(dribble())
        try:
            first = await raw.response()
            assert first.status == 413  # from the declared length, before any body
            responses = await raw.until_closed()
        finally:
            dribbler.cancel()
            raw.close()
        assert len(responses) == 1
        assert refused(app, "body_timeout") == 1


@pytest.mark.parametrize("route", ["trailer", "control-plane"])
async def test_bytes_after_the_headers_are_bounded_on_every_route(backend, route):
    # 2 x 1000 body bytes + 4096: what may follow a request's headers.
    settings = fast_settings([backend.url], max_body_bytes=1000, client_max_header_bytes=4096)
    async with running_proxy(settings) as (url, app):
        raw = await RawClient.connect(url)
        if route == "trailer":
            # A chunked body of two bytes, then a trailer that never ends: httptools would
            # buffer it whole, unseen by the app's body limit.
            head = (
                b"POST /v1/completions HTTP/1.1\r\nhost: proxy\r\n"
                b"transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nx-trailer: "
            )
        else:
            # The admin API reads its body whole, without the generation endpoints' limit.
            head = (
                b"POST /admin/backends HTTP/1.1\r\nhost: proxy\r\n"
                b"content-type: application/json\r\ncontent-length: 1000000000\r\n\r\n"
            )
        sent = 0

        async def pump() -> None:
            nonlocal sent
            await raw.send(head)
            while sent < 50 * 2**20:
                await raw.send(b"a" * 65536)
                sent += 65536

        try:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                await asyncio.wait_for(pump(), 30)
            [r] = await raw.until_closed()
        finally:
            raw.close()
        assert sent < 50 * 2**20
        assert r.status == 413
        assert "request over 6096 bytes after its headers" in r.error()["message"]
        assert refused(app, "body_too_large") == 1


async def test_fresh_connection_that_sends_nothing_is_closed_without_answer(backend, caplog):
    settings = fast_settings([backend.url], client_header_timeout=1.0)
    caplog.set_level(logging.WARNING, logger="fleet_proxy.front_door")
    async with running_proxy(settings) as (url, app):
        raw = await RawClient.connect(url)
        opened = time.monotonic()
        try:
            assert await raw.until_closed() == []
        finally:
            raw.close()
        assert time.monotonic() - opened >= 0.8
        assert refused(app, "header_timeout") == 1
    report = "\n".join(r.getMessage() for r in caplog.records)
    assert re.search(
        r"last header_timeout: open \d+\.\d s, 0 request head\(s\) before, 0 byte\(s\)", report
    ), report


async def test_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(backend):
    settings = fast_settings(
        [backend.url], client_keep_alive_timeout=0.3, client_header_timeout=30.0
    )
    async with running_proxy(settings) as (url, app):
        raw = await RawClient.connect(url)
        try:
            await raw.send(request("GET", "/health"))
            assert (await raw.response()).status == 200
            answered = time.monotonic()
            # (uvicorn's own default would be 5 s)
            assert len(await raw.until_closed(within=3.0)) == 1
        finally:
            raw.close()
        assert time.monotonic() - answered >= 0.25
        assert all(refused(app, reason) == 0 for reason in ("header_timeout", "body_timeout"))


async def held_requests(url: str, n: int, source: str | None = None) -> list[RawClient]:
    """`n` connections, each with a completion the backend holds (its `hold`): busy."""
    clients = [await RawClient.connect(url, source) for _ in range(n)]
    for raw in clients:
        await raw.send(request("POST", "/v1/completions", COMPLETION))
    return clients


async def test_connection_over_the_cap_with_every_request_busy_gets_503_at_once(backend):
    backend.behaviour.hold = asyncio.Semaphore(0)
    settings = fast_settings(
        [backend.url], client_max_connections=20, client_header_timeout=60, client_address_share=1
    )
    async with running_proxy(settings) as (url, app):
        await eventually(lambda: open_connections(app) == 0)  # the readiness poll's connection
        held = await held_requests(url, 20)
        extra = None
        try:
            await eventually(lambda: backend.active == 20)
            extra = await RawClient.connect(url)
            started = time.monotonic()
            [r] = await extra.until_closed()
            assert time.monotonic() - started < 5
            assert r.status == 503
            assert r.headers["retry-after"] == "1"
            assert r.headers["connection"] == "close"
            err = r.error()
            assert err["type"] == "service_unavailable"
            assert "20 open connections" in err["message"]
            assert open_connections(app) == 20
            assert refused(app, "connection_limit") == 1
            assert not any(raw.answered_or_closed() for raw in held)  # none closed for it
            # Room again once one is answered and closes: an ordinary client is served,
            # /metrics says so.
            for _ in range(21):
                backend.behaviour.hold.release()
            assert (await held[0].response()).status == 200
            held.pop(0).close()
            await eventually(lambda: open_connections(app) == 19)
            async with httpx.AsyncClient(base_url=url) as c:
                r2 = await c.post("/v1/completions", content=COMPLETION)
                assert r2.status_code == 200
                text = (await c.get("/metrics")).text
            assert (
                'fleet_proxy_client_connections_refused_total{reason="connection_limit"} 1.0'
                in text
            )
            assert "fleet_proxy_client_connections 20.0" in text
        finally:
            for raw in held:
                raw.close()
            if extra is not None:
                extra.close()


PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"


async def test_full_table_of_idle_and_half_sent_connections_makes_room_for_new_ones(backend):
    # A stream under way the whole test (60 events, 0.25 s apart): never the one closed.
    backend.behaviour.chunks = 60
    backend.behaviour.chunk_delay = 0.25
    settings = fast_settings([backend.url], client_max_connections=20, client_header_timeout=60)
    async with running_proxy(settings) as (url, app):
        await eventually(lambda: open_connections(app) == 0)  # the readiness poll's connection
        stream = await RawClient.connect(url)
        idle: list[RawClient] = []
        half: list[RawClient] = []
        kept: list[httpx.AsyncClient] = []
        try:
            body = b'{"model": "fake-model", "prompt": "hi", "max_tokens": 60, "stream": true}'
            await stream.send(request("POST", "/v1/completions", body))
            assert (await stream.head_received()).status == 200
            idle += [await RawClient.connect(url) for _ in range(10)]
            for _ in range(9):
                half.append(await RawClient.connect(url))
                await half[-1].send(PARTIAL_HEAD)
            await eventually(lambda: open_connections(app) == 20)
            # New clients, each keeping its connection: each takes the place of the one
            # waiting longest, the idle ones first, then the half-sent.
            for _ in range(12):
                c = httpx.AsyncClient(base_url=url)
                kept.append(c)
                r = await c.post("/v1/completions", content=COMPLETION)
                assert r.status_code == 200, r.text
            assert refused(app, "evicted_idle") == 10
            assert refused(app, "evicted_head") == 2
            assert refused(app, "connection_limit") == 0
            assert backend.active == 1  # the stream, still under way
            for raw in idle:  # closed without an answer: their clients sent no request
                assert await raw.until_closed() == []
            for raw in half[:2]:
                [r503] = await raw.until_closed()
                assert r503.status == 503 and r503.headers["retry-after"] == "1"
                err = r503.error()
                assert err["type"] == "service_unavailable"
                assert "to make room" in err["message"]
            assert not any(raw.answered_or_closed() for raw in half[2:])
            # The stream was never a candidate: it ends whole.
            [streamed] = await stream.until_closed_or_complete()
            events = [e for e in streamed.body.split(b"\n\n") if e.startswith(b"data: ")]
            assert len(events) == 61 and events[-1] == b"data: [DONE]"
        finally:
            for raw in [stream, *idle, *half]:
                raw.close()
            for c in kept:
                await c.aclose()


async def test_with_only_bodies_dribbling_the_oldest_gives_way_and_its_handler_sees_it(backend):
    backend.behaviour.hold = asyncio.Semaphore(0)
    settings = fast_settings(
        [backend.url],
        client_max_connections=4,
        client_header_timeout=60,
        client_body_timeout=60,
        client_address_share=1,
    )
    async with running_proxy(settings) as (url, app):
        await eventually(lambda: open_connections(app) == 0)
        head = request("POST", "/v1/completions", b" " * 200)[:-200]
        dribblers = []
        for _ in range(3):
            dribblers.append(await RawClient.connect(url))
            await dribblers[-1].send(head + COMPLETION[:1])
        # A request the backend holds fills the table; once it has reached the backend, the
        # heads sent before it have been read.
        [held] = await held_requests(url, 1)
        newcomer = None
        try:
            await eventually(lambda: backend.active == 1)
            newcomer = await RawClient.connect(url)
            await newcomer.send(request("GET", "/health"))
            assert (await newcomer.response()).status == 200
            [r] = await dribblers[0].until_closed()
            assert r.status == 503 and "to make room" in r.error()["message"]
            assert refused(app, "evicted_body") == 1
            assert not any(raw.answered_or_closed() for raw in [*dribblers[1:], held])
            # The handler reading that body was told of the disconnect.
            await eventually(
                lambda: (
                    app.core.prom.get_sample_value(
                        "fleet_proxy_requests_total",
                        {"endpoint": "completions", "model": "unknown", "status": "499"},
                    )
                    == 1
                )
            )
            backend.behaviour.hold.release()
            assert (await held.response()).status == 200
        finally:
            for raw in [*dribblers, held, *([newcomer] if newcomer else [])]:
                raw.close()


async def test_a_body_pipelined_behind_a_request_being_served_is_not_closed(backend):
    backend.behaviour.hold = asyncio.Semaphore(0)
    settings = fast_settings(
        [backend.url], client_max_connections=1, client_header_timeout=60, client_body_timeout=60
    )
    async with running_proxy(settings) as (url, app):
        await eventually(lambda: open_connections(app) == 0)
        raw = await RawClient.connect(url)
        extra = None
        try:
            # A request the backend holds, and the next one's head and part of its body.
            pipelined = request("POST", "/v1/completions", COMPLETION)
            await raw.send(request("POST", "/v1/completions", COMPLETION) + pipelined[:-10])
            await eventually(lambda: backend.active == 1)
            extra = await RawClient.connect(url)
            [r] = await extra.until_closed()
            assert r.status == 503 and refused(app, "connection_limit") == 1
            assert not raw.answered_or_closed()
            backend.behaviour.hold.release()
            backend.behaviour.hold.release()
            assert (await raw.response()).status == 200
            await raw.send(pipelined[-10:])
            assert (await raw.response()).status == 200
        finally:
            raw.close()
            if extra is not None:
                extra.close()


async def test_an_address_over_its_share_gives_way_first_and_only_to_itself(backend):
    # 20 connections, 10 an address: 127.0.0.2's are older, 127.0.0.1 holds more.
    settings = fast_settings([backend.url], client_max_connections=20, client_header_timeout=60)
    async with running_proxy(settings) as (url, app):
        await eventually(lambda: open_connections(app) == 0)
        older = [await RawClient.connect(url, "127.0.0.2") for _ in range(5)]
        crowd = [await RawClient.connect(url, "127.0.0.1") for _ in range(15)]
        newcomers: list[RawClient] = []
        try:
            await eventually(lambda: open_connections(app) == 20)
            for source in ("127.0.0.3", "127.0.0.1", "127.0.0.2"):
                raw = await RawClient.connect(url, source)
                newcomers.append(raw)
                await raw.send(request("GET", "/health"))
                assert (await raw.response()).status == 200
            # Each took the place of the crowding address's oldest, not of older ones.
            for raw in crowd[:3]:
                assert await raw.until_closed() == []
            assert not any(raw.answered_or_closed() for raw in older + crowd[3:])
            assert refused(app, "evicted_idle") == 3
        finally:
            for raw in older + crowd + newcomers:
                raw.close()


async def test_an_address_over_its_share_with_every_request_busy_is_refused(backend):
    backend.behaviour.hold = asyncio.Semaphore(0)
    settings = fast_settings([backend.url], client_max_connections=4, client_header_timeout=60)
    async with running_proxy(settings) as (url, app):
        await eventually(lambda: open_connections(app) == 0)
        held = await held_requests(url, 2, "127.0.0.1")  # its share: 2 of 4
        others = [await RawClient.connect(url, "127.0.0.2") for _ in range(2)]
        extra = []
        try:
            await eventually(lambda: backend.active == 2)
            await eventually(lambda: open_connections(app) == 4)
            extra.append(await RawClient.connect(url, "127.0.0.1"))
            [r] = await extra[-1].until_closed()
            assert r.status == 503
            assert "this client address holds its share" in r.error()["message"]
            assert not any(raw.answered_or_closed() for raw in others)
            assert refused(app, "connection_limit") == 1
            # Another address may still take a waiting connection's place.
            extra.append(await RawClient.connect(url, "127.0.0.3"))
            await extra[-1].send(request("GET", "/health"))
            assert (await extra[-1].response()).status == 200
            assert await others[0].until_closed() == []
            for _ in range(2):
                backend.behaviour.hold.release()
            assert [(await raw.response()).status for raw in held] == [200, 200]
        finally:
            for raw in held + others + extra:
                raw.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 32,  # a TLS ClientHello
        b"HELLO / HTTP/1.1\r\n\r\n",
        b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n",
    ],
    ids=["tls", "method", "header-line"],
)
async def test_malformed_request_gets_400_in_openai_shape(backend, garbage):
    async with running_proxy(fast_settings([backend.url])) as (url, app):
        raw = await RawClient.connect(url)
        try:
            await raw.send(garbage)
            [r] = await raw.until_closed()
        finally:
            raw.close()
        assert r.status == 400
        assert r.headers["connection"] == "close"
        err = r.error()
        assert err["type"] == "invalid_request_error"
        assert err["message"].startswith("malformed HTTP request")
        assert refused(app, "bad_request") == 1


async def test_refusal_behind_a_request_in_flight_follows_its_answer(backend):
    backend.behaviour = Behaviour(first_byte_delay=0.3)
    async with running_proxy(fast_settings([backend.url])) as (url, app):
        raw = await RawClient.connect(url)
        try:
            await raw.send(
                request("POST", "/v1/completions", COMPLETION) + b"HELLO / HTTP/1.1\r\n\r\n"
            )
            responses = await raw.until_closed()
        finally:
            raw.close()
        assert [r.status for r in responses] == [200, 400]
        assert json.loads(responses[0].body)["choices"]
        assert refused(app, "bad_request") == 1
