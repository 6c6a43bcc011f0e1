"""The default `ResponseStore`: SQLite from the standard library, in one file or in memory,
its calls run on a thread of its own so that the event loop never waits on the disk.

Retention is bounded twice: a record is dropped `ttl` seconds after it was created, and when
the records together pass `max_bytes` the oldest go first. Several serving processes may share
one file (WAL mode lets readers and a writer work at once).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from proxy.request.responses.store import StoredResponse, decoded, encoded, thread_record

T = TypeVar("T")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS responses (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created REAL NOT NULL,
        previous TEXT,
        size INTEGER NOT NULL,
        input BLOB NOT NULL,
        response BLOB NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created)",
    "CREATE TABLE IF NOT EXISTS response_totals "
    "(one INTEGER PRIMARY KEY CHECK (one = 1), bytes INTEGER NOT NULL)",
)
# The size of every record together, kept in the database itself by triggers so that every
# process sharing the file keeps it right. A file whose triggers are missing (one from before
# them) is counted once, in the transaction that adds them.
_COUNTED = "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = 'response_removed'"
_COUNTING = (
    """CREATE TRIGGER response_added AFTER INSERT ON responses BEGIN
        UPDATE response_totals SET bytes = bytes + NEW.size;
    END""",
    """CREATE TRIGGER response_resized AFTER UPDATE OF size ON responses BEGIN
        UPDATE response_totals SET bytes = bytes - OLD.size + NEW.size;
    END""",
    """CREATE TRIGGER response_removed AFTER DELETE ON responses BEGIN
        UPDATE response_totals SET bytes = bytes - OLD.size;
    END""",
    "INSERT OR REPLACE INTO response_totals SELECT 1, COALESCE(SUM(size), 0) FROM responses",
)
# A thread in one statement: from the newest back through `previous`, each link the owner's and
# unexpired, at most `most` deep; oldest first.
_THREAD = """
WITH RECURSIVE thread(depth, id, created, previous, input, response) AS (
    SELECT 1, id, created, previous, input, response FROM responses
    WHERE id = ? AND owner = ? AND created > ?
    UNION ALL
    SELECT thread.depth + 1, r.id, r.created, r.previous, r.input, r.response
    FROM thread JOIN responses AS r ON r.id = thread.previous
    WHERE thread.depth < ? AND r.owner = ? AND r.created > ?
)
SELECT id, created, previous, input, response FROM thread ORDER BY depth DESC
"""
# Expired records are swept at most this often by the writes; reads skip them at once.
SWEEP_EVERY_S = 60.0


def _set_up(db: sqlite3.Connection) -> None:
    """The tables, and the triggers with the first count where they are missing: all in one
    transaction that no other process's writes can come between."""
    db.execute("BEGIN IMMEDIATE")
    counted = db.execute(_COUNTED).fetchone() is not None
    for statement in _SCHEMA if counted else _SCHEMA + _COUNTING:
        db.execute(statement)
    db.commit()


class SqliteResponseStore:
    def __init__(
        self, path: Path | None, ttl: float, max_bytes: int, clock: Callable[[], float]
    ) -> None:
        """`path`: the database file (created when missing); None keeps it in memory, for this
        process only and until it stops."""
        self._path = ":memory:" if path is None else str(path)
        self._ttl = ttl
        self._max_bytes = max_bytes
        self._now = clock
        self._db: sqlite3.Connection | None = None  # opened on the store's thread
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="responses-store")
        self._swept_at = clock()

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._call, work)

    def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        db = self._db
        if db is None:
            db = sqlite3.connect(self._path, timeout=10.0, check_same_thread=False)
            try:
                if self._path != ":memory:":
                    db.execute("PRAGMA journal_mode=WAL")
                # A row that an INSERT OR REPLACE removes counts as deleted only with this on.
                db.execute("PRAGMA recursive_triggers = ON")
                _set_up(db)
            except BaseException:
                db.close()  # and the next call sets it up again
                raise
            self._db = db
        with db:  # one transaction per call
            return work(db)

    async def put(self, record: StoredResponse) -> None:
        items, response, size = encoded(record)
        now = self._now()
        sweep = now - self._swept_at >= SWEEP_EVERY_S
        if sweep:
            self._swept_at = now

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE "
                "SET owner = excluded.owner, created = excluded.created, "
                "previous = excluded.previous, size = excluded.size, input = excluded.input, "
                "response = excluded.response",
                (record.id, record.owner, record.created_at, record.previous_id, size, items,
                 response),
            )  # fmt: skip
            if sweep:
                db.execute("DELETE FROM responses WHERE created <= ?", (now - self._ttl,))
            self._fit(db)

        await self._run(write)

    def _fit(self, db: sqlite3.Connection) -> None:
        """Drop the oldest records until the rest fit in `max_bytes`."""
        (total,) = db.execute("SELECT bytes FROM response_totals").fetchone()
        over = int(total) - self._max_bytes
        if over <= 0:
            return
        doomed: list[tuple[str]] = []
        for rid, size in db.execute("SELECT id, size FROM responses ORDER BY created, id"):
            doomed.append((rid,))
            over -= size
            if over <= 0:
                break
        db.executemany("DELETE FROM responses WHERE id = ?", doomed)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        oldest = self._now() - self._ttl

        def read(db: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = db.execute(
                "SELECT created, previous, input, response FROM responses "
                "WHERE id = ? AND owner = ? AND created > ?",
                (response_id, owner, oldest),
            ).fetchone()
            return row

        return decoded(response_id, owner, await self._run(read))

    async def chain(self, response_id: str, owner: str, most: int) -> list[StoredResponse]:
        oldest = self._now() - self._ttl

        def read(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return db.execute(_THREAD, (response_id, owner, oldest, most, owner, oldest)).fetchall()

        return [thread_record(row, owner) for row in await self._run(read)]

    async def delete(self, response_id: str, owner: str) -> bool:
        oldest = self._now() - self._ttl

        def remove(db: sqlite3.Connection) -> bool:
            gone = db.execute(
                "DELETE FROM responses WHERE id = ? AND owner = ? AND created > ?",
                (response_id, owner, oldest),
            )
            return gone.rowcount > 0

        return await self._run(remove)

    async def expire(self) -> int:
        oldest = self._now() - self._ttl

        def sweep(db: sqlite3.Connection) -> int:
            return db.execute("DELETE FROM responses WHERE created <= ?", (oldest,)).rowcount

        self._swept_at = self._now()
        return await self._run(sweep)

    async def close(self) -> None:
        def shut(db: sqlite3.Connection) -> None:
            db.close()

        if self._db is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, shut, self._db)
            self._db = None
        self._thread.shutdown(wait=False)
