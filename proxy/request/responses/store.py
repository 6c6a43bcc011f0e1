"""What the Responses API keeps of each stored response, and the store it is kept in.

A record belongs to the API key that created it (`owner`, a SHA-256 of the key; "" when the
proxy takes no keys): every read names its owner, so another key's record is simply not
found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    owner: str
    created_at: float  # clock seconds, the store's TTL counts from here
    previous_id: str | None  # the response this one follows in its thread
    input_items: list[dict[str, Any]]  # this turn's own input, not its thread's
    response: dict[str, Any]  # the response object as the client reads it

    @property
    def status(self) -> str:
        status = self.response.get("status")
        return status if isinstance(status, str) else ""

    @property
    def output_items(self) -> list[dict[str, Any]]:
        output = self.response.get("output")
        return [o for o in output if isinstance(o, dict)] if isinstance(output, list) else []


def encoded(record: StoredResponse) -> tuple[bytes, bytes, int]:
    """A record's input items and response as a database keeps them, and the bytes it counts
    for against a store's size cap."""
    items, response = orjson.dumps(record.input_items), orjson.dumps(record.response)
    return items, response, len(items) + len(response) + len(record.id)


def decoded(response_id: str, owner: str, row: tuple[Any, ...] | None) -> StoredResponse | None:
    """The record of a row (created, previous, input, response) read back, None for no row."""
    if row is None:
        return None
    created, previous, items, response = row
    return StoredResponse(
        response_id, owner, created, previous, orjson.loads(items), orjson.loads(response)
    )


def thread_record(row: tuple[Any, ...], owner: str) -> StoredResponse:
    """The record of a thread's row (id, created, previous, input, response) read back."""
    rid, created, previous, items, response = row
    return StoredResponse(
        rid, owner, created, previous, orjson.loads(items), orjson.loads(response)
    )


class ResponseStore(Protocol):
    """Where stored responses live: one process's SQLite file or memory, or a database
    several proxy replicas share. Its methods never block the event loop."""

    async def put(self, record: StoredResponse) -> None:
        """Keep `record`, replacing one with its id."""

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The record, or None when it is unknown, expired or `owner`'s key did not create it."""

    async def chain(self, response_id: str, owner: str, most: int) -> list[StoredResponse]:
        """The thread ending with `response_id`, oldest first, read in one call: the records
        `get` would return, from `response_id` back through each `previous_id`, stopping at
        the first one `get` would not find or after `most` records. The caller tells a whole
        thread from a broken one by the first record's `previous_id`."""

    async def delete(self, response_id: str, owner: str) -> bool:
        """Forget the record; False when `get` would not have found it."""

    async def expire(self) -> int:
        """Drop the records past their time to live; how many were dropped."""

    async def close(self) -> None: ...
