"""The live-request table: entries keyed by themselves, found by request id, upstream id and
backend, counted as they come and go."""

from __future__ import annotations

from typing import Any

from fleet.live import LiveTable, MoveResult, NotMovable
from fleet.types import Backend


class Entry:
    """The few LiveEntry members the table reads."""

    def __init__(self, request_id: str, upstream_request_id: str, backend_id: str) -> None:
        self.request_id = request_id
        self.upstream_request_id = upstream_request_id
        self.backend_id = backend_id

    def view(self) -> dict[str, Any]:
        return {"request_id": self.request_id}

    async def move(
        self, to: Backend | None = None, reason: str = "admin", *, kind: str | None = None
    ) -> MoveResult:
        raise NotMovable("not_started")


def test_entries_are_registered_found_and_unregistered() -> None:
    table = LiveTable()
    a = Entry("r1", "u1", "b1")
    b = Entry("r2", "u2", "b1")
    c = Entry("r3", "u3", "b2")
    for e in (a, b, c):
        table.add(e)
    assert len(table) == 3
    assert list(table) == [a, b, c]  # in arrival order
    assert table.find("r2") == [b]
    assert table.find("nope") == []
    assert table.by_upstream_id("u3") is c
    assert table.by_upstream_id("r3") is None  # the client's id is not the upstream one
    assert table.on_backend("b1") == [a, b]
    assert table.on_backend("b2") == [c]
    assert table.on_backend("b3") == []
    table.remove(b)
    assert len(table) == 2
    assert table.find("r2") == []
    assert table.on_backend("b1") == [a]
    table.remove(b)  # twice: nothing happens
    table.remove(a)
    table.remove(c)
    assert len(table) == 0
    assert list(table) == []


def test_two_requests_with_one_client_id_are_two_entries() -> None:
    table = LiveTable()
    a = Entry("same", "same-1", "b1")
    b = Entry("same", "same-2", "b2")
    table.add(a)
    table.add(b)
    table.add(a)  # added again: still one entry
    assert len(table) == 2
    assert table.find("same") == [a, b]
    table.remove(a)
    assert table.find("same") == [b]
    assert table.by_upstream_id("same-2") is b


def test_iterating_is_safe_while_entries_leave() -> None:
    table = LiveTable()
    entries = [Entry(f"r{i}", f"u{i}", "b") for i in range(4)]
    for e in entries:
        table.add(e)
    for e in table:  # a snapshot: removing inside the loop does not break it
        table.remove(e)
    assert len(table) == 0


def test_not_movable_carries_its_reason_and_a_move_result_its_outcome() -> None:
    err = NotMovable("move_limit")
    assert err.reason == "move_limit"
    assert str(err) == "move_limit"
    assert MoveResult("ok", "b1", "b2").ok
    failed = MoveResult("failed", "b1", detail="x")
    assert not failed.ok
    assert (failed.target, failed.tokens, failed.downtime_s, failed.kind) == (
        None, 0, None, "recompute",
    )  # fmt: skip
