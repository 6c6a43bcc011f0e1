"""The Responses API's SQLite store alone: what one write costs in a store already holding many
responses, and what reading a long thread back costs, with no proxy and no engine around it.

    python scripts/bench_response_store.py [--records 130000] [--turns 50] [--repeat 20]

A file store in a temp dir is filled with `--records` responses of about 2 KB (a 256 MiB store,
the default cap, holds about 130,000), written through a plain sqlite3 connection; then one
thread of `--turns` responses is written through the store (the time of each `put`), and read
back `--repeat` times the way a new turn naming its last response reads it (`load_chain`).
Prints the medians. The temp dir is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from proxy.request.responses.chain import load_chain
from proxy.request.responses.sqlite_store import SqliteResponseStore
from proxy.request.responses.store import StoredResponse, encoded


def response(rid: str, previous: str | None) -> StoredResponse:
    said = {"type": "message", "role": "user", "content": "q" * 300}
    answer = {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "a" * 1500}]}  # fmt: skip
    output = {"id": rid, "object": "response", "status": "completed", "output": [answer]}
    return StoredResponse(rid, "", 1000.0, previous, [said], output)


def filled(path: Path, records: int) -> None:
    items, body, size = encoded(response("resp_filler", None))
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
            ((f"resp_f{i}", "", 1000.0, None, size, items, body) for i in range(records)),
        )


async def measure(args: argparse.Namespace, path: Path) -> tuple[float, float]:
    store = SqliteResponseStore(path, ttl=1e9, max_bytes=1 << 40, clock=lambda: 2000.0)
    try:
        await store.put(response("resp_first", None))  # makes the tables
        filled(path, args.records)
        puts: list[float] = []
        previous = None
        for turn in range(args.turns):
            rid = f"resp_t{turn}"
            start = time.perf_counter()
            await store.put(response(rid, previous))
            puts.append(time.perf_counter() - start)
            previous = rid
        assert previous is not None
        reads: list[float] = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            thread = await load_chain(store, previous, "")
            reads.append(time.perf_counter() - start)
        assert len(thread) == args.turns
        return statistics.median(puts), statistics.median(reads)
    finally:
        await store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=130_000, help="responses already stored")
    p.add_argument("--turns", type=int, default=50, help="turns of the thread written and read")
    p.add_argument("--repeat", type=int, default=20, help="reads of the thread")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-proxy-store-") as tmp:
        put, read = asyncio.run(measure(args, Path(tmp) / "responses.sqlite3"))
    print(
        f"{args.records} records stored: put p50 {put * 1000:.2f} ms; "
        f"a {args.turns}-turn thread read p50 {read * 1000:.2f} ms"
    )


if __name__ == "__main__":
    main()
