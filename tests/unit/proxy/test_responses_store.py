"""The Responses API's store and thread expansion: time to live, the size cap and the total it
keeps for it, each key seeing only its own responses, and threads read back whole in one
statement, or refused naming the response that breaks them."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import ProxyError
from proxy.request.responses import chain as chain_module
from proxy.request.responses.chain import load_chain
from proxy.request.responses.sqlite_store import SWEEP_EVERY_S, SqliteResponseStore
from proxy.request.responses.store import StoredResponse, encoded
from proxy.request.responses.thread import expanded_input, input_items, prompt_text


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def said(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


def answer(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    item = {
        "id": "msg_" + rid,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {"id": rid, "object": "response", "status": status, "output": [item]}


def record(
    rid: str, owner: str = "", at: float = 1000.0, previous: str | None = None, text: str = "x"
) -> StoredResponse:
    return StoredResponse(rid, owner, at, previous, [said("user", "q " + rid)], answer(rid, text))


@pytest.fixture
async def clock_store() -> AsyncIterator[tuple[Clock, SqliteResponseStore]]:
    clock = Clock()
    store = SqliteResponseStore(None, ttl=100.0, max_bytes=1 << 20, clock=clock)
    yield clock, store
    await store.close()


async def test_a_record_comes_back_as_it_was_put(clock_store) -> None:
    _, store = clock_store
    kept = record("resp_a", previous="resp_0")
    await store.put(kept)
    assert await store.get("resp_a", "") == kept
    assert await store.get("resp_b", "") is None


async def test_a_record_lives_for_its_ttl_then_is_gone(clock_store) -> None:
    clock, store = clock_store
    await store.put(record("resp_a", at=clock.t))
    clock.t += 99.0
    assert await store.get("resp_a", "") is not None
    clock.t += 2.0
    assert await store.get("resp_a", "") is None  # read as gone at once
    assert await store.expire() == 1  # and swept


async def test_writes_sweep_what_expired(clock_store) -> None:
    clock, store = clock_store
    await store.put(record("resp_old", at=clock.t))
    clock.t += SWEEP_EVERY_S + 100.0
    await store.put(record("resp_new", at=clock.t))
    assert await store.expire() == 0  # the write swept it already


async def test_past_the_size_cap_the_oldest_records_go_first() -> None:
    clock = Clock()
    _, _, size = encoded(record("resp_0", text="y" * 1000))
    store = SqliteResponseStore(None, ttl=100.0, max_bytes=3 * size + size // 2, clock=clock)
    try:
        for i in range(5):
            await store.put(record(f"resp_{i}", at=clock.t + i, text="y" * 1000))
        kept = [i for i in range(5) if await store.get(f"resp_{i}", "") is not None]
        assert kept == [2, 3, 4]  # three fit
    finally:
        await store.close()


async def test_a_record_is_seen_only_with_the_key_that_made_it(clock_store) -> None:
    _, store = clock_store
    await store.put(record("resp_a", owner="alice"))
    assert await store.get("resp_a", "alice") is not None
    assert await store.get("resp_a", "bob") is None
    assert await store.get("resp_a", "") is None
    assert not await store.delete("resp_a", "bob")
    assert await store.get("resp_a", "alice") is not None
    assert await store.delete("resp_a", "alice")
    assert await store.get("resp_a", "alice") is None


async def test_a_three_deep_thread_expands_to_every_turn_in_order(clock_store) -> None:
    _, store = clock_store
    await store.put(record("resp_1", text="one"))
    await store.put(record("resp_2", previous="resp_1", text="two"))
    await store.put(record("resp_3", previous="resp_2", text="three"))
    chain = await load_chain(store, "resp_3", "")
    assert [r.id for r in chain] == ["resp_1", "resp_2", "resp_3"]
    new = input_items({"input": "and now?"})
    whole = expanded_input(chain, new)
    texts = [i["content"] if i["role"] == "user" else i["content"][0]["text"] for i in whole]
    assert texts == ["q resp_1", "one", "q resp_2", "two", "q resp_3", "three", "and now?"]
    # Each turn's routing text starts with the one before: the thread finds its engine.
    shorter = prompt_text(None, expanded_input(chain[:2], input_items({"input": "q resp_3"})))
    assert prompt_text(None, whole).startswith(shorter)


async def test_a_thread_with_a_missing_or_foreign_link_is_not_found(clock_store) -> None:
    _, store = clock_store
    await store.put(record("resp_1", owner="alice"))
    await store.put(record("resp_2", owner="alice", previous="resp_1"))
    with pytest.raises(ProxyError) as e:
        await load_chain(store, "resp_2", "bob")
    assert e.value.status == 404 and "resp_2" in e.value.message
    await store.delete("resp_1", "alice")
    with pytest.raises(ProxyError) as e:
        await load_chain(store, "resp_2", "alice")
    assert e.value.status == 404 and "resp_1" in e.value.message


async def test_an_unfinished_response_cannot_be_continued(clock_store) -> None:
    _, store = clock_store
    running = StoredResponse("resp_1", "", 1000.0, None, [], answer("resp_1", "", "in_progress"))
    await store.put(running)
    with pytest.raises(ProxyError) as e:
        await load_chain(store, "resp_1", "")
    assert e.value.status == 400


async def test_a_file_store_is_shared_by_two_stores_on_it(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "responses.sqlite3"
    a = SqliteResponseStore(path, ttl=100.0, max_bytes=1 << 20, clock=clock)
    b = SqliteResponseStore(path, ttl=100.0, max_bytes=1 << 20, clock=clock)
    try:
        await a.put(record("resp_a"))
        assert await b.get("resp_a", "") == record("resp_a")
    finally:
        await a.close()
        await b.close()


def test_input_must_be_text_or_items() -> None:
    assert input_items({"input": [said("user", "hi")]}) == [said("user", "hi")]
    for bad in (None, [], ["text"], 3):
        with pytest.raises(ProxyError):
            input_items({"input": bad})


def stored_total(path: Path) -> tuple[int, int]:
    """The total the store keeps, and the sum of its records' sizes counted afresh."""
    with sqlite3.connect(path) as db:
        (kept,) = db.execute("SELECT bytes FROM response_totals").fetchone()
        (counted,) = db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()
    return kept, counted


async def test_the_kept_total_stays_exact_through_every_kind_of_write(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "responses.sqlite3"
    _, _, size = encoded(record("resp_00", text="y" * 500))
    a = SqliteResponseStore(path, ttl=100.0, max_bytes=6 * size, clock=clock)
    b = SqliteResponseStore(path, ttl=100.0, max_bytes=6 * size, clock=clock)
    try:
        for i in range(4):  # inserts, from both stores
            await (a, b)[i % 2].put(record(f"resp_{i:02}", at=clock.t + i, text="y" * 500))
        await b.put(record("resp_01", at=clock.t + 1, text="z" * 900))  # a bigger replace
        await a.put(record("resp_02", at=clock.t + 2, text="z"))  # a smaller one
        assert await b.delete("resp_03", "")
        kept, counted = stored_total(path)
        assert kept == counted > 0
        for i in range(4, 12):  # past the cap: the oldest go
            await (a, b)[i % 2].put(record(f"resp_{i:02}", at=clock.t + i, text="y" * 500))
        assert await a.get("resp_00", "") is None
        kept, counted = stored_total(path)
        assert kept == counted <= 6 * size
        clock.t += SWEEP_EVERY_S + 200.0  # all expired: a write sweeps them, then the rest
        await a.put(record("resp_new", at=clock.t))
        assert stored_total(path) == (encoded(record("resp_new"))[2],) * 2
        await b.put(record("resp_more", at=clock.t))
        clock.t += 150.0
        assert await b.expire() == 2
        assert stored_total(path) == (0, 0)
    finally:
        await a.close()
        await b.close()


async def test_a_file_from_before_the_kept_total_is_counted_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    items, response, size = encoded(record("resp_old"))
    with sqlite3.connect(path) as db:  # the table as earlier versions made it, no total
        db.execute(
            "CREATE TABLE responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL "
            "NOT NULL, previous TEXT, size INTEGER NOT NULL, input BLOB NOT NULL, "
            "response BLOB NOT NULL)"
        )
        db.execute(
            "INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
            ("resp_old", "", 1000.0, None, size, items, response),
        )
    store = SqliteResponseStore(path, ttl=100.0, max_bytes=1 << 20, clock=Clock())
    try:
        await store.put(record("resp_new", previous="resp_old"))
        assert stored_total(path) == (2 * size, 2 * size)
        assert [r.id for r in await load_chain(store, "resp_new", "")] == ["resp_old", "resp_new"]
    finally:
        await store.close()


def traced(store: SqliteResponseStore) -> list[str]:
    """The statements the store's connection runs from now on."""
    statements: list[str] = []
    assert store._db is not None
    store._db.set_trace_callback(statements.append)
    return statements


async def test_a_write_reads_the_kept_total_and_sums_nothing(clock_store) -> None:
    _, store = clock_store
    await store.put(record("resp_1"))  # opens the database
    statements = traced(store)
    await store.put(record("resp_2"))
    assert any("response_totals" in s for s in statements)
    assert not any("SUM(" in s.upper() for s in statements)


async def test_a_fifty_turn_thread_is_read_in_one_statement(clock_store) -> None:
    _, store = clock_store
    previous = None
    for i in range(50):
        await store.put(record(f"resp_{i:02}", owner="alice", previous=previous))
        previous = f"resp_{i:02}"
    statements = traced(store)
    chain = await load_chain(store, "resp_49", "alice")
    assert [r.id for r in chain] == [f"resp_{i:02}" for i in range(50)]
    assert chain[10] == record("resp_10", owner="alice", previous="resp_09")
    assert len(statements) == 1 and "WITH RECURSIVE" in statements[0]


async def thread_of(store: SqliteResponseStore, n: int, owner: str = "alice") -> None:
    previous = None
    for i in range(n):
        await store.put(record(f"resp_{i}", owner=owner, previous=previous))
        previous = f"resp_{i}"


async def test_a_broken_link_mid_thread_is_named(clock_store) -> None:
    clock, store = clock_store
    await thread_of(store, 6)
    await store.delete("resp_3", "alice")
    with pytest.raises(ProxyError) as e:
        await load_chain(store, "resp_5", "alice")
    assert e.value.status == 404 and "'resp_3'" in e.value.message
    # another key's record in the thread is not found either
    await store.put(record("resp_3", owner="bob", previous="resp_2"))
    with pytest.raises(ProxyError) as e:
        await load_chain(store, "resp_5", "alice")
    assert e.value.status == 404 and "'resp_3'" in e.value.message
    # nor an expired one, though it is still in the table
    await store.put(record("resp_3", owner="alice", at=clock.t - 200.0, previous="resp_2"))
    with pytest.raises(ProxyError) as e:
        await load_chain(store, "resp_5", "alice")
    assert e.value.status == 404 and "'resp_3'" in e.value.message
    await store.put(record("resp_3", owner="alice", previous="resp_2"))
    assert len(await load_chain(store, "resp_5", "alice")) == 6


async def test_an_unfinished_response_mid_thread_is_named(clock_store) -> None:
    _, store = clock_store
    await thread_of(store, 4)
    running = answer("resp_2", "", "in_progress")
    await store.put(StoredResponse("resp_2", "alice", 1000.0, "resp_1", [], running))
    with pytest.raises(ProxyError) as e:
        await load_chain(store, "resp_3", "alice")
    assert e.value.status == 400 and "'resp_2'" in e.value.message


async def test_a_thread_longer_than_the_bound_is_refused(clock_store, monkeypatch) -> None:
    _, store = clock_store
    monkeypatch.setattr(chain_module, "MAX_TURNS", 5)
    await thread_of(store, 5)
    assert len(await load_chain(store, "resp_4", "alice")) == 5
    await thread_of(store, 6)
    with pytest.raises(ProxyError) as e:
        await load_chain(store, "resp_5", "alice")
    assert e.value.status == 400 and "over 5" in e.value.message


async def test_a_store_that_failed_to_open_opens_again_on_the_next_call(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    path.write_bytes(b"not a database, " * 64)
    store = SqliteResponseStore(path, ttl=100.0, max_bytes=1 << 20, clock=Clock())
    try:
        with pytest.raises(sqlite3.DatabaseError):
            await store.put(record("resp_a"))
        path.unlink()
        await store.put(record("resp_a"))  # set up this time, tables, triggers and total
        assert stored_total(path) == (encoded(record("resp_a"))[2],) * 2
    finally:
        await store.close()
