"""The proxy's server wakes once a second while idle, not ten times as uvicorn's does, and
still stops at once when asked and keeps its Date header current. A real server on a real
port in a thread of its own, as `fleet-proxy serve` and every worker run it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from proxy.serving.front_door import GracefulServer


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


class CountingServer(GracefulServer):
    ticks = 0

    async def on_tick(self, counter: int) -> bool:
        self.ticks += 1
        return await super().on_tick(counter)


class SlowTickServer(CountingServer):
    TICK_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(cls: type[CountingServer]) -> Iterator[tuple[CountingServer, threading.Thread, str]]:
    port = free_port()
    config = uvicorn.Config(hello, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = cls(config, grace=1.0)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield server, thread, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)


def test_an_idle_server_ticks_about_once_a_second() -> None:
    with running(CountingServer) as (server, _, _):
        start = server.ticks
        time.sleep(1.5)
        # uvicorn's own loop would have ticked 15 times; a loaded machine delays timers,
        # never brings them forward, so the bound holds there too.
        assert server.ticks - start <= 3


def test_a_stop_asked_from_another_thread_ends_the_wait_for_the_next_tick() -> None:
    with running(SlowTickServer) as (server, thread, url):
        assert httpx.get(url).text == "ok"
        server.should_exit = True
        thread.join(20)  # without the wake-up it would wait out its 60 s tick
        assert not thread.is_alive()


def test_the_date_header_moves_on_with_the_clock() -> None:
    with running(CountingServer) as (_, _, url):
        first = httpx.get(url).headers["date"]
        deadline = time.monotonic() + 10
        while (later := httpx.get(url).headers["date"]) == first:
            assert time.monotonic() < deadline, "the Date header stood still"
            time.sleep(0.1)
        assert later != first
