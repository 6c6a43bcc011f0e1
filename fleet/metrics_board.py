"""What one worker process learns of each backend, posted for the others (`--workers N`).

Scraping a vLLM /metrics page and parsing it costs a worker milliseconds of CPU per backend
per scrape interval, and a health check about one; N workers each polling every backend paid
it N times, and an idle proxy burned a core's share per worker doing it. So one worker (the
first) polls, and posts what it found (parsed metrics on one board, health verdicts on
another) into shared memory; the others read it (proxy/control/shared_scrapes.py).

Layout: a header of four int64 (MAGIC, VERSION, slots, payload bytes), then one cell per
backend slot (the slots of fleet/peer_load.py's `SlotTable`, which every worker derives alike):

    seq (int64), generation (int64), taken_at (float64), length (int64), payload bytes

One writer per cell. It makes `seq` odd, writes, then makes it even again (a sequence lock):
a reader that sees an odd `seq`, or a different `seq` after reading than before, read a cell
being written and tries again at its next read. `length` is TOO_LARGE when the metrics did not
fit the payload: the readers then poll that backend themselves.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import orjson

from fleet.types import EngineMetrics

MAGIC = 0x466C6565744D6574  # "FleetMet"
VERSION = 1
DEFAULT_PAYLOAD = 2048
VERDICT_PAYLOAD = 512  # a health verdict: its failure's detail, cut to fit
TOO_LARGE = -1

_HEADER = struct.Struct("<qqqq")
_CELL = struct.Struct("<qqdq")  # seq, generation, taken_at, length
_SEQ = struct.Struct("<q")
# JSON gives lists back; these fields are tuples (every one of them defaults to ()).
_TUPLES = frozenset(f.name for f in fields(EngineMetrics) if isinstance(f.default, tuple))


class BoardMismatch(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class BoardLayout:
    slots: int
    payload: int = DEFAULT_PAYLOAD

    @property
    def cell_bytes(self) -> int:
        return _CELL.size + (self.payload + 7) // 8 * 8

    @property
    def size_bytes(self) -> int:
        return _HEADER.size + self.slots * self.cell_bytes

    def cell(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside 0..{self.slots - 1}")
        return _HEADER.size + slot * self.cell_bytes


@dataclass(frozen=True, slots=True)
class Posted:
    """One cell's content as last read: its sequence number (two more per post), and the
    posted bytes or None when they did not fit (TOO_LARGE)."""

    seq: int
    taken_at: float
    data: bytes | None


def encode_metrics(metrics: EngineMetrics) -> bytes:
    return orjson.dumps(metrics)


def decode_metrics(data: bytes) -> EngineMetrics:
    raw: dict[str, Any] = orjson.loads(data)
    values: dict[str, Any] = {k: tuple(v) if k in _TUPLES else v for k, v in raw.items()}
    return EngineMetrics(**values)


class BoardSegment:
    """The board's lifetime: created, and finally unlinked, by the supervisor (as
    fleet/peer_load.py's `PeerSegment`)."""

    def __init__(self, layout: BoardLayout) -> None:
        self.layout = layout
        self._shm = SharedMemory(create=True, size=layout.size_bytes)
        buf = self._shm.buf
        assert buf is not None
        _HEADER.pack_into(buf, 0, MAGIC, VERSION, layout.slots, layout.payload)

    @property
    def name(self) -> str:
        return self._shm.name

    def close(self) -> None:
        self._shm.close()
        self._shm.unlink()


class MetricsBoard:
    """One process's view of a board."""

    def __init__(self, shm: SharedMemory) -> None:
        self._shm = shm
        buf = shm.buf
        if buf is None:
            raise ValueError(f"shared memory {shm.name} is closed")
        self._buf = buf
        magic, version, slots, payload = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC or version != VERSION:
            raise BoardMismatch("shared segment is not a fleet-proxy metrics board")
        self.layout = BoardLayout(slots, payload)

    @classmethod
    def attach(cls, name: str) -> MetricsBoard:
        return cls(SharedMemory(name=name))

    def post(self, slot: int, generation: int, taken_at: float, data: bytes) -> bool:
        """Write a backend's newest news into its cell; False when it did not fit (the cell
        then tells readers to poll the backend themselves)."""
        fits = len(data) <= self.layout.payload
        at = self.layout.cell(slot)
        buf = self._buf
        seq = _SEQ.unpack_from(buf, at)[0]
        _SEQ.pack_into(buf, at, seq + 1)  # odd: being written
        if fits:
            buf[at + _CELL.size : at + _CELL.size + len(data)] = data
        length = len(data) if fits else TOO_LARGE
        _CELL.pack_into(buf, at, seq + 2, generation, taken_at, length)
        return fits

    def read(self, slot: int, generation: int, after: int) -> Posted | None:
        """The cell's content if it is the given generation's and newer than seq `after`;
        None when it is not, or is being written."""
        at = self.layout.cell(slot)
        buf = self._buf
        seq, gen, taken_at, length = _CELL.unpack_from(buf, at)
        if seq == after or seq % 2 or gen != generation:
            return None
        data = bytes(buf[at + _CELL.size : at + _CELL.size + max(0, length)])
        if _SEQ.unpack_from(buf, at)[0] != seq:
            return None  # rewritten while read
        return Posted(seq, taken_at, None if length == TOO_LARGE else data)

    def close(self) -> None:
        self._buf.release()
        self._shm.close()
