"""The Responses API's store in PostgreSQL, on a server the test starts: the store's retention,
the size total it keeps, per-key visibility, threads read in one query, and two proxy
replicas sharing it, one continuing the other's thread and seeing its background response."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from itertools import pairwise
from typing import Any

import openai
import psycopg
import pytest

from proxy.errors import ProxyError
from proxy.request.responses.chain import MAX_TURNS, load_chain
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
        db.execute("DROP TABLE IF EXISTS fleet_proxy_responses, fleet_proxy_response_totals")
    return pg_url


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def record(
    rid: str, owner: str = "", at: float = 1000.0, text: str = "x", previous: str | None = None
) -> StoredResponse:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                                  "text": text}]}  # fmt: skip
    return StoredResponse(
        rid, owner, at, previous, [{"role": "user", "content": "q"}],
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


def stored_total(url: str) -> tuple[int, int]:
    """The total the store keeps, and the sum of its records' sizes counted afresh."""
    with psycopg.connect(url) as db:
        kept = db.execute("SELECT bytes FROM fleet_proxy_response_totals").fetchone()
        counted = db.execute("SELECT COALESCE(SUM(size), 0) FROM fleet_proxy_responses").fetchone()
    assert kept is not None and counted is not None
    return int(kept[0]), int(counted[0])


async def test_the_kept_total_stays_exact_across_two_replicas(empty: str) -> None:
    clock = Clock()
    _, _, size = encoded(record("resp_00", text="y" * 500))
    a = PostgresResponseStore(empty, ttl=100.0, max_bytes=6 * size, clock=clock)
    b = PostgresResponseStore(empty, ttl=100.0, max_bytes=6 * size, clock=clock)
    try:
        for i in range(4):
            await (a, b)[i % 2].put(record(f"resp_{i:02}", at=clock.t + i, text="y" * 500))
        await b.put(record("resp_01", at=clock.t + 1, text="z" * 900))  # replaced, bigger
        assert await a.delete("resp_03", "")
        kept, counted = stored_total(empty)
        assert kept == counted > 0
        for i in range(4, 12):  # past the cap: the oldest go
            await (a, b)[i % 2].put(record(f"resp_{i:02}", at=clock.t + i, text="y" * 500))
        assert await a.get("resp_00", "") is None
        kept, counted = stored_total(empty)
        assert kept == counted <= 6 * size
        clock.t += 200.0
        assert await b.expire() > 0
        assert stored_total(empty) == (0, 0)
    finally:
        await a.close()
        await b.close()


async def test_a_table_from_before_the_kept_total_is_counted_when_opened(empty: str) -> None:
    items, response, size = encoded(record("resp_old"))
    with psycopg.connect(empty) as db:  # the table as earlier versions made it
        db.execute(
            "CREATE TABLE fleet_proxy_responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
            "created DOUBLE PRECISION NOT NULL, previous TEXT, size BIGINT NOT NULL, "
            "input BYTEA NOT NULL, response BYTEA NOT NULL)"
        )
        db.execute(
            "INSERT INTO fleet_proxy_responses VALUES (%s, %s, %s, %s, %s, %s, %s)",
            ("resp_old", "", 1000.0, None, size, items, response),
        )
    s = PostgresResponseStore(empty, ttl=100.0, max_bytes=1 << 20, clock=Clock())
    try:
        await s.put(record("resp_new", previous="resp_old"))
        assert stored_total(empty) == (2 * size, 2 * size)
    finally:
        await s.close()


async def test_a_thread_is_read_whole_in_one_call_or_refused_naming_its_break(store) -> None:
    clock, s = store
    previous = None
    for i in range(50):
        await s.put(record(f"resp_{i:02}", owner="alice", at=clock.t, previous=previous))
        previous = f"resp_{i:02}"
    chain = await s.chain("resp_49", "alice", MAX_TURNS + 1)
    assert [r.id for r in chain] == [f"resp_{i:02}" for i in range(50)]
    assert chain[0] == record("resp_00", owner="alice", at=clock.t)
    assert [r.id for r in await s.chain("resp_49", "alice", 5)] == [
        f"resp_{i}" for i in range(45, 50)
    ]  # the bound
    assert await s.chain("resp_49", "bob", 100) == []
    await s.put(record("resp_20", owner="bob", previous="resp_19"))  # another key's link
    with pytest.raises(ProxyError) as e:
        await load_chain(s, "resp_49", "alice")
    assert e.value.status == 404 and "'resp_20'" in e.value.message
    await s.put(record("resp_20", owner="alice", at=clock.t - 150.0, previous="resp_19"))
    with pytest.raises(ProxyError) as e:  # an expired one
        await load_chain(s, "resp_49", "alice")
    assert e.value.status == 404 and "'resp_20'" in e.value.message
    await s.put(record("resp_20", owner="alice", at=clock.t, previous="resp_19"))
    assert await s.delete("resp_30", "alice")  # a missing one
    with pytest.raises(ProxyError) as e:
        await load_chain(s, "resp_49", "alice")
    assert e.value.status == 404 and "'resp_30'" in e.value.message
    assert len(await load_chain(s, "resp_29", "alice")) == 30


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
