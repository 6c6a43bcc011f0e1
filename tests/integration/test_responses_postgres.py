"""The Responses API's store in PostgreSQL, on a server the test starts: the store's retention
and per-key visibility, and two proxy replicas sharing it, one continuing the other's thread
and seeing its background response."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from itertools import pairwise
from typing import Any

import openai
import psycopg
import pytest

from proxy.request.responses.postgres_store import PostgresResponseStore
from proxy.request.responses.store import StoredResponse, encoded
from simulator.fleet import SimFleet, start_fleet
from tests.support.polling import eventually
from tests.support.postgres import postgres_server
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
pytestmark = pytest.mark.slow  # a PostgreSQL cluster made and started per module


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture
def empty(pg_url: str) -> str:
    with psycopg.connect(pg_url) as db:
        db.execute("DROP TABLE IF EXISTS fleet_proxy_responses")
    return pg_url


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def record(rid: str, owner: str = "", at: float = 1000.0, text: str = "x") -> StoredResponse:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                                  "text": text}]}  # fmt: skip
    return StoredResponse(
        rid, owner, at, None, [{"role": "user", "content": "q"}],
        {"id": rid, "status": "completed", "output": [item]},
    )  # fmt: skip


@pytest.fixture
async def store(empty: str) -> AsyncIterator[tuple[Clock, PostgresResponseStore]]:
    clock = Clock()
    s = PostgresResponseStore(empty, ttl=100.0, max_bytes=1 << 20, clock=clock)
    yield clock, s
    await s.close()


async def test_records_keep_to_their_key_and_their_ttl(store) -> None:
    clock, s = store
    await s.put(record("resp_a", owner="alice", at=clock.t))
    assert await s.get("resp_a", "alice") == record("resp_a", owner="alice", at=clock.t)
    assert await s.get("resp_a", "bob") is None
    assert not await s.delete("resp_a", "bob")
    clock.t += 101.0
    assert await s.get("resp_a", "alice") is None
    assert await s.expire() == 1


async def test_past_the_size_cap_the_oldest_go_first(empty: str) -> None:
    clock = Clock()
    _, _, size = encoded(record("resp_probe", text="y" * 1000))
    s = PostgresResponseStore(empty, ttl=100.0, max_bytes=3 * size + size // 2, clock=clock)
    try:
        for i in range(5):
            await s.put(record(f"resp_{i}", at=clock.t + i, text="y" * 1000))
        kept = [i for i in range(5) if await s.get(f"resp_{i}", "") is not None]
        assert kept == [2, 3, 4]
    finally:
        await s.close()


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(2, speed=20.0) as f:
        yield f


async def test_two_replicas_share_threads_and_background_responses(
    fleet: SimFleet, empty: str
) -> None:
    settings = fast_settings(fleet.urls, responses_store_url=empty, api_keys=["key-a", "key-b"])
    async with running_proxy(settings) as (url_a, _), running_proxy(settings) as (url_b, _):
        a = openai.AsyncOpenAI(base_url=url_a + "/v1", api_key="key-a", max_retries=0)
        b = openai.AsyncOpenAI(base_url=url_b + "/v1", api_key="key-a", max_retries=0)
        other = openai.AsyncOpenAI(base_url=url_b + "/v1", api_key="key-b", max_retries=0)
        turns: list[Any] = []
        previous = None
        for i in range(4):
            made = await (a, b)[i % 2].responses.create(
                model=MODEL, input=f"Turn {i}", max_output_tokens=4,
                **({"previous_response_id": previous} if previous else {}),
            )  # fmt: skip
            assert made.previous_response_id == previous
            turns.append(made)
            previous = made.id
        for before, after in pairwise(turns):
            assert after.usage.input_tokens > before.usage.input_tokens + before.usage.output_tokens
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(previous)

        queued = await a.responses.create(
            model=MODEL, input="later", max_output_tokens=4, background=True
        )

        async def done_seen_by_b() -> Any:
            got = await b.responses.retrieve(queued.id)
            return got if got.status not in ("queued", "in_progress") else None

        done = await eventually(done_seen_by_b, within=30, what="replica b seeing the answer")
        assert done.output_text
        await b.responses.delete(previous)
        with pytest.raises(openai.NotFoundError):
            await a.responses.retrieve(previous)
        for c in (a, b, other):
            await c.close()
