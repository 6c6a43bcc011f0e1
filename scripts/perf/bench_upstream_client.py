"""CPU per request of the forwarding client: aiohttp ClientSession vs proxy.upstream.UpstreamPool.

Starts scripts/perf/fast_fake_vllm.py as a subprocess, then drives it from this process with
each client: --requests POSTs to /v1/completions at --concurrency, non-streaming (16 tokens)
and streaming (64 SSE events, every piece iterated). Prints this process's CPU time per request
(time.process_time, so the backend's CPU is not counted) and requests per second; each figure
is the best of --repeat rounds. aiohttp is configured as proxy/core.py configures it.

    python scripts/perf/bench_upstream_client.py [--requests 5000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
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

from proxy.upstream import UpstreamPool  # noqa: E402

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
def fake_backend() -> Iterator[str]:
    """The fast fake vLLM on a free port, stopped by PID on the way out (also on errors)."""
    port = overhead.free_port()
    origin = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, str(HERE / "fast_fake_vllm.py"), "--port", str(port)]
    with (
        tempfile.TemporaryDirectory() as tmp,
        overhead.process(cmd, Path(tmp) / "backend.log"),
    ):
        overhead.wait_http(origin + "/health", timeout=20)
        yield origin


OneRequest = Callable[[], Awaitable[None]]


async def drive(one: OneRequest, requests: int, concurrency: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) to run `requests` calls of `one` at `concurrency`."""
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.process_time() - cpu0, time.perf_counter() - wall0


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


async def run(origin: str, args: argparse.Namespace) -> list[tuple[str, str, float, float]]:
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
            for name, one in clients.items():
                await drive(one, min(args.requests, 500), args.concurrency)  # warm the pool
                best_cpu, best_wall = float("inf"), float("inf")
                for _ in range(args.repeat):
                    cpu, wall = await drive(one, args.requests, args.concurrency)
                    best_cpu, best_wall = min(best_cpu, cpu), min(best_wall, wall)
                rows.append((name, mode, best_cpu / args.requests, args.requests / best_wall))
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
    args = p.parse_args()
    if not (0 < args.requests <= 200_000 and 0 < args.concurrency <= 1024):
        p.error("--requests must be 1..200000 and --concurrency 1..1024")
    with fake_backend() as origin:
        runner = uvloop.run if args.loop == "uvloop" else asyncio.run
        rows = runner(run(origin, args))
    print(
        f"{args.requests} requests x {args.repeat} rounds at concurrency {args.concurrency}, "
        f"{args.loop} loop; best round"
    )
    print(f"{'client':<10} {'mode':<11} {'CPU us/req':>11} {'req/s':>9}")
    base = {mode: cpu for name, mode, cpu, _ in rows if name == "aiohttp"}
    for name, mode, cpu, rate in rows:
        ratio = f"  ({cpu / base[mode]:.0%} of aiohttp)" if name != "aiohttp" else ""
        print(f"{name:<10} {mode:<11} {cpu * 1e6:>11.1f} {rate:>9.0f}{ratio}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
