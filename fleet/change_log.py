"""An append-only log of fleet changes shared by the proxy's worker processes.

One JSON object per line in a file under a directory the supervisor creates. A writer takes an
exclusive `flock`, notes the file's size (the change's position, unique and increasing) and
appends its line in one write; readers poll the size and read the complete lines past what
they have read. Every worker so sees every change, its own included, in one order.

Why a file rather than the shared-memory segment: changes are rare, variable in size and
unbounded in number; a file needs no capacity and the kernel already orders appends.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import orjson

Change = dict[str, Any]


class ChangeLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        self._read_to = 0
        self._partial = b""

    @property
    def read_to(self) -> int:
        """Position just past the last complete line read."""
        return self._read_to

    def append(self, change: Change) -> int:
        """Append `change`; returns its position in the log."""
        line = orjson.dumps(change) + b"\n"
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            position = os.fstat(self._fd).st_size
            os.write(self._fd, line)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return position

    def read_new(self) -> list[tuple[int, Change]]:
        """Changes appended since the last call, each with its position, in log order."""
        start = self._read_to + len(self._partial)
        size = os.fstat(self._fd).st_size
        if size <= start:
            return []
        base = self._read_to
        data = self._partial + os.pread(self._fd, size - start, start)
        out: list[tuple[int, Change]] = []
        i = 0
        while (end := data.find(b"\n", i)) >= 0:
            out.append((base + i, orjson.loads(data[i:end])))
            i = end + 1
        # The start of a line still being written waits for its end.
        self._partial = data[i:]
        self._read_to = base + i
        return out

    def close(self) -> None:
        os.close(self._fd)
