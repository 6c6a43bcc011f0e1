"""Simulated engines on real loopback ports (port 0), one fleet per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from simulator.fleet import SimFleet, start_fleet
from simulator.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer()


@pytest.fixture
async def fleet(tokenizer: Tokenizer) -> AsyncIterator[SimFleet]:
    async with await start_fleet(2, tokenizer=tokenizer, speed=4.0) as f:
        yield f


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def post_json(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], **kw: Any
) -> tuple[int, Any]:
    async with http.post(url, json=body, **kw) as r:
        return r.status, await r.json(content_type=None)


async def read_sse(resp: aiohttp.ClientResponse) -> tuple[list[dict[str, Any]], bool]:
    """All data chunks of a stream, and whether it ended with [DONE]."""
    chunks: list[dict[str, Any]] = []
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        payload = line[6:]
        if payload == b"[DONE]":
            return chunks, True
        chunks.append(orjson.loads(payload))
    return chunks, False
