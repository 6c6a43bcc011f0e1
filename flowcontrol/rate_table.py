"""Where the rate limits' buckets live: a fixed table of tenants in one memory map, so that
with `--workers N` every worker reads and charges the same buckets and a limit holds for the
whole proxy.

A row per tenant: the tenant's 64-bit name hash (0: free), then its two levels and their time,
found by linear probing from the hash (at most `PROBES` rows). When those rows are all taken
the one updated longest ago is given to the new tenant (rows are never emptied, so no
tenant's probe sequence is cut). With
one process the map is anonymous and unlocked; with several it is a file every worker maps,
and each read-modify-write holds the file's `flock` (a few microseconds under the lock; the
kernel lets it go if a worker dies holding it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from typing import TypeVar

from flowcontrol.rate_limit import Buckets

ROW = struct.Struct("<qddd")  # name hash, requests, tokens, at
DEFAULT_ROWS = 4096
# How far from its hash's row a tenant may live: a lookup costs at most this many rows, even
# with the table full of tenants a client made up.
PROBES = 32
T = TypeVar("T")


def table_bytes(rows: int = DEFAULT_ROWS) -> int:
    return rows * ROW.size


def create_table_file(path: str, rows: int = DEFAULT_ROWS) -> None:
    """The file the workers map (made by the supervisor before they start): all rows free."""
    with open(path, "wb") as f:
        f.truncate(table_bytes(rows))


class RateTable:
    """`update(tenant, step)`: `step` gets the tenant's buckets (None: never seen, or
    forgotten) and returns the new ones and a result, as one atomic step across workers."""

    def __init__(self, path: str | None = None, rows: int = DEFAULT_ROWS) -> None:
        self.rows = rows
        self._fd: int | None = None
        if path is None:
            self._map = mmap.mmap(-1, table_bytes(rows))
        else:
            self._fd = os.open(path, os.O_RDWR)
            size = os.fstat(self._fd).st_size
            if size != table_bytes(rows):
                os.close(self._fd)
                raise ValueError(f"{path} holds {size} bytes, not a table of {rows} rows")
            self._map = mmap.mmap(self._fd, size)

    def close(self) -> None:
        self._map.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = self._fd
        if fd is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def update(self, tenant: str, step: Callable[[Buckets | None], tuple[Buckets, T]]) -> T:
        key = _key(tenant)
        with self._locked():
            row, found = self._find(key)
            state = None
            if found:
                _, r, t, at = ROW.unpack_from(self._map, row * ROW.size)
                state = Buckets(r, t, at)
            after, result = step(state)
            ROW.pack_into(self._map, row * ROW.size, key, after.requests, after.tokens, after.at)
            return result

    def _find(self, key: int) -> tuple[int, bool]:
        """The row of `key` (True), else the row to put it in (False)."""
        rows = self.rows
        start = key % rows
        oldest, oldest_at = start, float("inf")
        m = self._map
        for i in range(min(PROBES, rows)):
            row = (start + i) % rows
            k, _, _, at = ROW.unpack_from(m, row * ROW.size)
            if k == key:
                return row, True
            if k == 0:
                return row, False
            if at < oldest_at:
                oldest, oldest_at = row, at
        return oldest, False


def _key(tenant: str) -> int:
    digest = hashlib.blake2b(tenant.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True) or 1
