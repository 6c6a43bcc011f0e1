"""CPU per request of the forwarding client: aiohttp ClientSession vs the proxy's own
proxy.backends.upstream.UpstreamPool.

Starts scripts/perf/fast_fake_vllm.py as a subprocess, then drives it from this process with
each client: --requests POSTs to /v1/completions at --concurrency, non-streaming (16 tokens)
and streaming (64 SSE events, every piece iterated); with --floor also a raw protocol that
does no HTTP at all, the cost of the socket reads and task wake-ups any client pays. Prints
this process's CPU time per request (time.process_time, so the backend's CPU is not counted),
requests per second and read syscalls per request (from /proc/self/io: a streamed response
costs one read and one task wake-up per burst of events, so a client that keeps up pays for
more reads, and when both processes are saturated the fastest client reads the most often);
each figure is from the round with the least CPU of --repeat rounds. aiohttp is configured as
proxy/serving/wiring.py configures it. --rate paces the requests below saturation; --event-gap
spaces the streamed events as an engine spaces tokens (each event then is one read for any client).

    python scripts/perf/bench_upstream_client.py [--requests 5000] [--concurrency 32]
    python scripts/perf/bench_upstream_client.py --event-gap 1 --concurrency 64 --floor
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import uvloop

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

import bench_proxy_overhead as overhead  # noqa: E402  (free_port, wait_http, process)
import fast_fake_vllm  # noqa: E402  (the exact bytes it answers with)

from proxy.backends.upstream import UpstreamPool  # noqa: E402

PATH = "/v1/completions"
HEADERS = {"content-type": "application/json"}
RAW_HEADERS = [(b"content-type", b"application/json")]
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 60.0


def body(stream: bool) -> bytes:
    return json.dumps(
        {"model": "fake-model", "prompt": "Say something.", "max_tokens": 16, "stream": stream}
    ).encode()


@contextlib.contextmanager
def fake_backend(event_gap: float) -> Iterator[str]:
    """The fast fake vLLM on a free port, stopped by PID on the way out (also on errors).

    With `event_gap` (seconds) it sleeps that long between streamed events instead of one
    loop turn, as a real engine spaces tokens, so that each event is one socket read.
    """
    port = overhead.free_port()
    origin = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, str(HERE / "fast_fake_vllm.py"), "--port", str(port)]
    if event_gap > 0:
        cmd = [
            sys.executable,
            "-c",
            SPACED_BACKEND.format(here=str(HERE), gap=event_gap, port=port),
        ]
    with (
        tempfile.TemporaryDirectory() as tmp,
        overhead.process(cmd, Path(tmp) / "backend.log"),
    ):
        overhead.wait_http(origin + "/health", timeout=20)
        yield origin


SPACED_BACKEND = """
import asyncio, sys
sys.path.insert(0, {here!r})
import fast_fake_vllm as f

async def stream(self, t):
    t.write(f.STREAM_HEAD)
    for _ in range(self.chunks):
        if t.is_closing():
            return
        t.write(f.CHUNK)
        await asyncio.sleep({gap!r})
    t.write(f.LAST)

f.Handler.stream = stream
sys.argv = ["fast_fake_vllm.py", "--port", "{port}"]
f.main()
"""

OneRequest = Callable[[], Awaitable[None]]


def read_syscalls() -> int:
    """Read syscalls of this process so far (uvloop reads sockets with read(2)); 0 if unknown."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("syscr:"):
                return int(line.split()[1])
    return 0


async def drive(
    one: OneRequest, requests: int, concurrency: int, rate: float | None = None
) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, read syscalls) for `requests` calls of `one` at
    `concurrency`; with `rate`, request i starts no earlier than i/rate seconds in."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < requests:
            i = issued
            issued += 1
            if rate is not None:
                delay = start + i / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            await one()

    reads0, cpu0, wall0 = read_syscalls(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu, wall, read_syscalls() - reads0


async def last_piece(pieces: AsyncIterator[bytes]) -> bytes:
    got = b""
    async for piece in pieces:
        got = piece
    return got


def check(status: int, stream: bool, got: bytes) -> None:
    """The whole answer arrived: the final SSE event, or the JSON completion."""
    assert status == 200, status
    if stream:
        assert got.endswith(b"data: [DONE]\n\n"), got[-40:]
    else:
        assert got.endswith(b"}") and len(got) > 100, got[-40:]


def aiohttp_call(session: aiohttp.ClientSession, url: str, stream: bool) -> OneRequest:
    data = body(stream)

    async def one() -> None:
        async with session.post(url, data=data, headers=HEADERS) as resp:
            got = await (last_piece(resp.content.iter_any()) if stream else resp.read())
            check(resp.status, stream, got)

    return one


def lean_call(pool: UpstreamPool, origin: str, stream: bool) -> OneRequest:
    data = body(stream)

    async def one() -> None:
        async with await pool.request(origin, PATH, RAW_HEADERS, data) as resp:
            got = await (last_piece(resp) if stream else resp.read())
            check(resp.status, stream, got)

    return one


class FloorConnection(asyncio.Protocol):
    """No HTTP at all: a socket read and a consumer wake-up per read, the cost any asyncio
    client pays. It spots the end of this backend's answers by their fixed last bytes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reads: list[bytes] = []
        self.tail = b""
        self.end = b""
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.reads.append(data)
        self.tail = (self.tail + data)[-32:]
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def floor_call(origin: str, stream: bool) -> OneRequest:
    data = body(stream)
    request = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n\r\n%s" % (
        PATH.encode(),
        origin.removeprefix("http://").encode(),
        len(data),
        b"\r\n".join(b"%s: %s" % h for h in RAW_HEADERS),
        data,
    )
    end = fast_fake_vllm.LAST if stream else fast_fake_vllm.COMPLETION[-24:]
    host, port = origin.removeprefix("http://").split(":")
    idle: list[FloorConnection] = []

    async def one() -> None:
        if idle:
            conn = idle.pop()
        else:
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_connection(FloorConnection, host, int(port))
        assert conn.transport is not None
        conn.tail = b""
        conn.transport.write(request)
        while not conn.tail.endswith(end):
            conn.waiter = asyncio.get_running_loop().create_future()
            await conn.waiter
            conn.reads.clear()
        idle.append(conn)

    return one


async def within(seconds: float, work: Awaitable[list[Row]]) -> list[Row]:
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        raise SystemExit(f"the benchmark did not finish within --time-limit {seconds:g}s") from None


Row = tuple[str, str, float, float, float]  # client, mode, CPU s/request, requests/s, reads/req


async def run(origin: str, args: argparse.Namespace) -> list[Row]:
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1024, limit_per_host=0, ttl_dns_cache=300),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT
        ),
        skip_auto_headers=("User-Agent",),
    )
    pool = UpstreamPool(connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT)
    rows = []
    try:
        for stream in (False, True):
            mode = "stream" if stream else "non-stream"
            clients = {
                "aiohttp": aiohttp_call(session, origin + PATH, stream),
                "upstream": lean_call(pool, origin, stream),
            }
            if args.floor:
                clients["raw-floor"] = floor_call(origin, stream)
            for name, one in clients.items():
                # Warm the pool, at full speed.
                await drive(one, min(args.requests, 500), args.concurrency)
                best: tuple[float, float, int] | None = None
                for _ in range(args.repeat):
                    got = await drive(one, args.requests, args.concurrency, args.rate)
                    best = got if best is None or got[0] < best[0] else best
                assert best is not None
                cpu, wall, reads = best
                n = args.requests
                rows.append((name, mode, cpu / n, n / wall, reads / n))
    finally:
        await session.close()
        await pool.close()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    p.add_argument(
        "--rate",
        type=float,
        help="start requests at this many per second (at most --concurrency at once) instead "
        "of as fast as they finish: keeps both processes below saturation, where a streamed "
        "event is one socket read for any client",
    )
    p.add_argument(
        "--event-gap",
        type=float,
        default=0.0,
        metavar="MS",
        help="the backend waits this long between streamed events (default: one loop turn)",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also time a client that does no HTTP parsing: what any asyncio client pays",
    )
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds for the whole run")
    args = p.parse_args()
    if not (0 < args.requests <= 200_000 and 0 < args.concurrency <= 1024):
        p.error("--requests must be 1..200000 and --concurrency 1..1024")
    if args.rate is not None and not args.requests / 120 <= args.rate <= 1e6:
        p.error("--rate must keep a round under two minutes")
    # SIGTERM unwinds like Ctrl-C, so the backend subprocess is stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with fake_backend(args.event_gap / 1000) as origin:
        runner = uvloop.run if args.loop == "uvloop" else asyncio.run
        rows = runner(within(args.time_limit, run(origin, args)))
    pace = f", started at {args.rate:g}/s" if args.rate else ""
    if args.event_gap:
        pace += f", {args.event_gap:g} ms between streamed events"
    print(
        f"{args.requests} requests x {args.repeat} rounds at concurrency {args.concurrency}"
        f"{pace}, {args.loop} loop; the round with the least CPU"
    )
    print(f"{'client':<10} {'mode':<11} {'CPU us/req':>11} {'req/s':>9} {'reads/req':>10}")
    base = {mode: cpu for name, mode, cpu, _, _ in rows if name == "aiohttp"}
    for name, mode, cpu, rate, reads in rows:
        ratio = f"  ({cpu / base[mode]:.0%} of aiohttp)" if name != "aiohttp" else ""
        # asyncio's loop reads with recv(2), which /proc/self/io does not count.
        shown = f"{reads:.1f}" if args.loop == "uvloop" else "-"
        print(f"{name:<10} {mode:<11} {cpu * 1e6:>11.1f} {rate:>9.0f} {shown:>10}{ratio}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
