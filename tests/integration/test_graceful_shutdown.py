"""`fleet-proxy serve` as a real process stopped by a real SIGTERM with a stream in flight:
within the grace period the stream ends whole while new connections are refused and idle
keep-alive connections are closed (so no request, /ready included, reaches the proxy after
the signal: a load balancer sees its connection closed and the next one refused); past it the
stream's connection is closed and the process exits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.support.fake_backend import Behaviour, FakeBackend
from tests.support.polling import eventually
from tests.support.processes import refused

LISTENING = re.compile(rb"fleet-proxy listening: base_url = http://127\.0\.0\.1:(\d+)/v1")
STREAM = {"model": "fake-model", "prompt": "hello", "max_tokens": 64, "stream": True}


@contextlib.asynccontextmanager
async def serving(
    backend: str, grace: float, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_PROXY_")}
    env["FLEET_PROXY_SHUTDOWN_GRACE_PERIOD"] = str(grace)
    env["FLEET_PROXY_HEALTH_INTERVAL"] = "0.1"
    env["FLEET_PROXY_SCRAPE_INTERVAL"] = "0.05"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy.serving.cli", "serve", "--port", "0", "--backend", backend,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.wait_for(proc.wait(), 30)


async def listening_port(proc: asyncio.subprocess.Process) -> int:
    assert proc.stdout is not None
    for _ in range(20):
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if found := LISTENING.search(line):
            return int(found.group(1))
    raise AssertionError("no listening line")


async def ready(base: str) -> None:
    async with httpx.AsyncClient(base_url=base) as c:

        async def answers_ready() -> bool:
            return (await c.get("/ready")).status_code == 200

        await eventually(answers_ready, within=30, what="the proxy ready", every=0.02)


def events(lines: list[str]) -> list[str]:
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


@contextlib.asynccontextmanager
async def stopped_mid_stream(
    proc: asyncio.subprocess.Process, port: int | None = None
) -> AsyncIterator[tuple[int, list[str], AsyncIterator[str]]]:
    """A stream through the proxy, SIGTERM sent once its first line has arrived: the port,
    the lines read so far and the rest of the stream's lines. `port`: the proxy's, when the
    caller has read it already."""
    if port is None:
        port = await listening_port(proc)
    base = f"http://127.0.0.1:{port}"
    await ready(base)
    async with (
        httpx.AsyncClient(base_url=base, timeout=30) as c,
        c.stream("POST", "/v1/completions", json=STREAM) as r,
    ):
        assert r.status_code == 200
        body = r.aiter_lines()
        lines = [await anext(body)]
        proc.send_signal(signal.SIGTERM)
        yield port, lines, body


async def exit_code(proc: asyncio.subprocess.Process) -> int:
    return await asyncio.wait_for(proc.wait(), 30)


async def ready_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """GET /ready on an open keep-alive connection: the status (the connection stays open)."""
    writer.write(b"GET /ready HTTP/1.1\r\nhost: proxy\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
    assert length is not None and b"connection: close" not in head.lower(), head
    await asyncio.wait_for(reader.readexactly(int(length.group(1))), 10)
    return int(head.split(b" ", 2)[1])


@pytest.mark.slow
async def test_a_stream_in_flight_finishes_whole_while_no_new_request_gets_in(
    tmp_path: Path,
) -> None:
    # Once the signal has arrived no request reaches the proxy, on a new connection or one
    # kept open from before it: so /ready has nothing to answer 503 to in the grace period.
    backend = FakeBackend(behaviour=Behaviour(chunks=20, chunk_delay=0.1))
    await backend.start()
    try:
        async with serving(backend.url, 30, tmp_path / "proxy.log") as proc:
            port = await listening_port(proc)
            await ready(f"http://127.0.0.1:{port}")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                assert await ready_on(reader, writer) == 200
                async with stopped_mid_stream(proc, port) as (_, lines, rest):
                    # The proxy closes the idle connection by itself, at once: nothing was
                    # sent on it after the signal, and it ends without a byte (well before
                    # its keep-alive timeout, 60 s).
                    assert await asyncio.wait_for(reader.read(), 5) == b""
                    await eventually(
                        lambda: refused(port), within=10, what="connections refused after SIGTERM"
                    )
                    # ...while the stream is still in flight: it goes on, to its end.
                    after = [line async for line in rest]
            finally:
                writer.close()
            assert len(events(after)) >= 2
            got = events(lines + after)
            assert got[-1] == "[DONE]"
            assert len(got) == 21  # every token event, then [DONE]
            assert "t19 " in got[-2]
            assert await exit_code(proc) in (0, -signal.SIGTERM)
        assert backend.cancelled == 0
    finally:
        await backend.stop()


@pytest.mark.slow
async def test_past_the_grace_period_the_stream_is_stopped_short_and_the_process_exits(
    tmp_path: Path,
) -> None:
    backend = FakeBackend(behaviour=Behaviour(chunks=300, chunk_delay=0.1))
    await backend.start()
    log = tmp_path / "proxy.log"
    try:
        async with serving(backend.url, 0.5, log) as proc:
            async with stopped_mid_stream(proc) as (_, lines, rest):
                with pytest.raises(httpx.RemoteProtocolError):
                    async for line in rest:
                        lines.append(line)
            got = events(lines)
            assert "[DONE]" not in got
            assert 1 <= len(got) < 300
            assert await exit_code(proc) in (0, -signal.SIGTERM)
        # The backend's request was closed with the client's connection.
        await eventually(lambda: backend.cancelled == 1, what="the backend's request cancelled")
        assert backend.active == 0
        text = log.read_text()
        assert "shutdown grace period of 0.5 s over: closing 1 connection(s)" in text
        assert "Traceback" not in text
    finally:
        await backend.stop()
