"""A `ResponseStore` in PostgreSQL, for several proxy replicas (on several hosts) sharing their
stored responses: a thread continues whichever replica takes its next turn.

psycopg 3's asyncio connection: no thread, no blocking of the event loop. One connection per
proxy process, its statements one at a time (a store call is one or two short statements);
a connection that broke is opened again by the next call. Retention is the SQLite store's:
`ttl` seconds from creation, and the oldest first past `max_bytes` in all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from proxy.request.responses.store import StoredResponse, decoded, encoded

T = TypeVar("T")

_SCHEMA = (
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
)
SWEEP_EVERY_S = 60.0


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
                db = self._db = await psycopg.AsyncConnection.connect(self._url)
                async with db.transaction():
                    for statement in _SCHEMA:
                        await db.execute(statement)
            async with db.transaction():
                return await work(db)

    async def put(self, record: StoredResponse) -> None:
        items, response, size = encoded(record)
        now = self._now()
        sweep = now - self._swept_at >= SWEEP_EVERY_S
        if sweep:
            self._swept_at = now

        async def write(db: psycopg.AsyncConnection[Any]) -> None:
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
        """Drop the oldest records until the rest fit in `max_bytes` (one statement: the
        records whose running total from the newest passes the cap)."""
        await db.execute(
            "DELETE FROM fleet_proxy_responses WHERE id IN (SELECT id FROM ("
            "SELECT id, SUM(size) OVER (ORDER BY created DESC, id DESC) AS kept "
            "FROM fleet_proxy_responses) AS t WHERE kept > %s)",
            (self._max_bytes,),
        )

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
