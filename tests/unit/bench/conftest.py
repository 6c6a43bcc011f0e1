"""A fake OpenAI server on a real port (port 0), in its own thread and event loop, so tests can
call the synchronous `bench.cli.main` against it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from bench.fake_openai import FakeState, start


@dataclass
class FakeServer:
    state: FakeState
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _serve(states: list[FakeState]) -> Iterator[list[FakeServer]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started = [asyncio.run_coroutine_threadsafe(start(s), loop).result(10) for s in states]
    servers = []
    for state, (_, port) in zip(states, started, strict=True):
        state.backend_id = state.backend_id or f"127.0.0.1:{port}"
        servers.append(FakeServer(state, port))
    try:
        yield servers
    finally:
        for runner, _ in started:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def fake_pair() -> Iterator[list[FakeServer]]:
    """Two fake backends streaming one token per chunk with 1 ms between tokens."""
    yield from _serve([FakeState("", ttft_s=0.002, itl_s=0.001) for _ in range(2)])
