"""A `ResponseStore` in PostgreSQL, for several proxy replicas (on several hosts) sharing their
stored responses: a thread continues whichever replica takes its next turn.

psycopg 3's asyncio connection: no thread, no blocking of the event loop. One connection per
proxy process, its statements one at a time (a store call is a few short statements);
a connection that broke is opened again by the next call. Retention is the SQLite store's:
`ttl` seconds from creation, and the oldest first past `max_bytes` in all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from proxy.request.responses.store import StoredResponse, decoded, encoded, thread_record

T = TypeVar("T")

_SCHEMA = (
    # One replica at a time sets the schema up: the triggers and the first count must not
    # race another replica's.
    "SELECT pg_advisory_xact_lock(7046083391)",
    """CREATE TABLE IF NOT EXISTS fleet_proxy_responses (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL,
        previous TEXT,
        size BIGINT NOT NULL,
        input BYTEA NOT NULL,
        response BYTEA NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS fleet_proxy_responses_by_age ON fleet_proxy_responses (created)",
    """CREATE TABLE IF NOT EXISTS fleet_proxy_response_totals (
        one INTEGER PRIMARY KEY CHECK (one = 1),
        bytes BIGINT NOT NULL
    )""",
    """CREATE OR REPLACE FUNCTION fleet_proxy_response_counted() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE fleet_proxy_response_totals SET bytes = bytes
            + CASE WHEN TG_OP = 'DELETE' THEN 0 ELSE NEW.size END
            - CASE WHEN TG_OP = 'INSERT' THEN 0 ELSE OLD.size END;
        RETURN NULL;
    END $$""",
)
# The size of every record together, kept in the database by a trigger so that every replica
# keeps it right. A table without the trigger (one from before it) is counted once, in the
# transaction that adds it: the trigger's lock on the table keeps writes out until then.
_COUNTED = (
    "SELECT 1 FROM pg_trigger WHERE tgname = 'fleet_proxy_response_counted' "
    "AND tgrelid = 'fleet_proxy_responses'::regclass"
)
_COUNTING = (
    """CREATE TRIGGER fleet_proxy_response_counted
    AFTER INSERT OR DELETE OR UPDATE OF size ON fleet_proxy_responses
    FOR EACH ROW EXECUTE FUNCTION fleet_proxy_response_counted()""",
    "INSERT INTO fleet_proxy_response_totals SELECT 1, COALESCE(SUM(size), 0) "
    "FROM fleet_proxy_responses ON CONFLICT (one) DO UPDATE SET bytes = EXCLUDED.bytes",
)
# Every write takes the total's row first, so that writers (of any replica) queue on it in one
# order and never deadlock on each other's records.
_TAKE_TOTAL = "SELECT bytes FROM fleet_proxy_response_totals WHERE one = 1 FOR UPDATE"
# A thread in one statement: from the newest back through `previous`, each link the owner's and
# unexpired, at most `most` deep; oldest first.
_THREAD = """
WITH RECURSIVE thread(depth, id, created, previous, input, response) AS (
    SELECT 1, id, created, previous, input, response FROM fleet_proxy_responses
    WHERE id = %(id)s AND owner = %(owner)s AND created > %(oldest)s
    UNION ALL
    SELECT thread.depth + 1, r.id, r.created, r.previous, r.input, r.response
    FROM thread JOIN fleet_proxy_responses AS r ON r.id = thread.previous
    WHERE thread.depth < %(most)s AND r.owner = %(owner)s AND r.created > %(oldest)s
)
SELECT id, created, previous, input, response FROM thread ORDER BY depth DESC
"""
SWEEP_EVERY_S = 60.0


async def _set_up(db: psycopg.AsyncConnection[Any]) -> None:
    """The tables, and the trigger with the first count where it is missing."""
    async with db.transaction():
        for statement in _SCHEMA:
            await db.execute(statement)
        counted = await (await db.execute(_COUNTED)).fetchone()
        for statement in () if counted else _COUNTING:
            await db.execute(statement)


class PostgresResponseStore:
    def __init__(self, url: str, ttl: float, max_bytes: int, clock: Callable[[], float]) -> None:
        self._url = url
        self._ttl = ttl
        self._max_bytes = max_bytes
        self._now = clock
        self._db: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._swept_at = clock()

    async def _run(self, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        async with self._lock:
            db = self._db
            if db is None or db.closed or db.broken:
                db = await psycopg.AsyncConnection.connect(self._url)
                try:
                    await _set_up(db)
                except BaseException:
                    await db.close()  # and the next call sets it up again
                    raise
                self._db = db
            async with db.transaction():
                return await work(db)

    async def put(self, record: StoredResponse) -> None:
        items, response, size = encoded(record)
        now = self._now()
        sweep = now - self._swept_at >= SWEEP_EVERY_S
        if sweep:
            self._swept_at = now

        async def write(db: psycopg.AsyncConnection[Any]) -> None:
            await db.execute(_TAKE_TOTAL)
            await db.execute(
                "INSERT INTO fleet_proxy_responses VALUES (%s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, "
                "created = EXCLUDED.created, previous = EXCLUDED.previous, "
                "size = EXCLUDED.size, input = EXCLUDED.input, response = EXCLUDED.response",
                (record.id, record.owner, record.created_at, record.previous_id, size, items,
                 response),
            )  # fmt: skip
            if sweep:
                await db.execute(
                    "DELETE FROM fleet_proxy_responses WHERE created <= %s", (now - self._ttl,)
                )
            await self._fit(db)

        await self._run(write)

    async def _fit(self, db: psycopg.AsyncConnection[Any]) -> None:
        """Drop the oldest records until the rest fit in `max_bytes`: the total is kept by the
        trigger, and only when it is over are the oldest read, as far as they need be."""
        cursor = await db.execute("SELECT bytes FROM fleet_proxy_response_totals WHERE one = 1")
        row = await cursor.fetchone()
        over = int(row[0]) - self._max_bytes if row is not None else 0
        if over <= 0:
            return
        while over > 0:  # the oldest a batch at a time: the index reads no further
            cursor = await db.execute(
                "SELECT id, size FROM fleet_proxy_responses ORDER BY created, id LIMIT 32"
            )
            doomed: list[str] = []
            for rid, size in await cursor.fetchall():
                doomed.append(rid)
                over -= size
                if over <= 0:
                    break
            if not doomed:
                return
            await db.execute("DELETE FROM fleet_proxy_responses WHERE id = ANY(%s)", (doomed,))

    async def chain(self, response_id: str, owner: str, most: int) -> list[StoredResponse]:
        oldest = self._now() - self._ttl

        async def read(db: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            cursor = await db.execute(
                _THREAD, {"id": response_id, "owner": owner, "oldest": oldest, "most": most}
            )
            return await cursor.fetchall()

        return [thread_record(row, owner) for row in await self._run(read)]

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        oldest = self._now() - self._ttl

        async def read(db: psycopg.AsyncConnection[Any]) -> tuple[Any, ...] | None:
            cursor = await db.execute(
                "SELECT created, previous, input, response FROM fleet_proxy_responses "
                "WHERE id = %s AND owner = %s AND created > %s",
                (response_id, owner, oldest),
            )
            return await cursor.fetchone()

        return decoded(response_id, owner, await self._run(read))

    async def delete(self, response_id: str, owner: str) -> bool:
        oldest = self._now() - self._ttl

        async def remove(db: psycopg.AsyncConnection[Any]) -> bool:
            await db.execute(_TAKE_TOTAL)
            cursor = await db.execute(
                "DELETE FROM fleet_proxy_responses WHERE id = %s AND owner = %s AND created > %s",
                (response_id, owner, oldest),
            )
            return cursor.rowcount > 0

        return await self._run(remove)

    async def expire(self) -> int:
        oldest = self._now() - self._ttl
        self._swept_at = self._now()

        async def sweep(db: psycopg.AsyncConnection[Any]) -> int:
            await db.execute(_TAKE_TOTAL)
            cursor = await db.execute(
                "DELETE FROM fleet_proxy_responses WHERE created <= %s", (oldest,)
            )
            return cursor.rowcount

        return await self._run(sweep)

    async def close(self) -> None:
        async with self._lock:
            if self._db is not None:
                await self._db.close()
                self._db = None
