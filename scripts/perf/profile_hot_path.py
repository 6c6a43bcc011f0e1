"""Where the proxy's CPU goes per request, measured without a load generator or a server.

Drives fleet-proxy's hot-path ASGI handler directly (fake ASGI receive/send, as uvicorn would
call it) against a fast fake vLLM backend over real loopback sockets, and reports the CPU time
of this process per request. CPU time, unlike wall time or requests/s, barely moves when other
work shares the machine, so it compares code changes fairly. With --profile it prints the top
functions by own time (cProfile), which is where the README's performance notes come from.

    python scripts/perf/profile_hot_path.py [--requests 4000] [--concurrency 32] [--stream]

--prompt-chars N sends the prompt bench_proxy_overhead.py sends with the same option (a
prefix-aware policy hashes, matches and records one block per 64 characters of it).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from proxy.serving.app import create_app  # noqa: E402
from proxy.settings import load_settings  # noqa: E402

BODY = '{"model":"fake-model","prompt":"%s","max_tokens":16%s}'
SENTENCE = "Say something about routers."


def prompt_of(chars: int | None) -> str:
    """The sentence, or it repeated to `chars` characters (as bench_proxy_overhead.py does)."""
    if chars is None:
        return SENTENCE
    return (f"{SENTENCE} " * (chars // len(SENTENCE) + 1))[:chars]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def one_request(app: Any, body: bytes) -> int:
    """One request as uvicorn presents it: the body, then `http.disconnect` only once the
    response is complete (or the client is gone)."""
    sent = False
    status = 0
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body", False):
            done.set()

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    await app(scope, receive, send)
    return status


async def run(args: argparse.Namespace, ports: list[int]) -> None:
    settings = load_settings(
        {"backends": [f"http://127.0.0.1:{p}" for p in ports], "policy": args.policy}
    )
    app = create_app(settings)
    await app.core.start()
    for _ in range(200):
        if app.core.fleet.routable(app.core.clock.now()) and all(
            b.spec.models for b in app.core.fleet
        ):
            break
        await asyncio.sleep(0.05)
    body = (BODY % (prompt_of(args.prompt_chars), ',"stream":true' if args.stream else "")).encode()
    await asyncio.gather(*(one_request(app.forwarder, body) for _ in range(200)))  # warm-up
    profiler = cProfile.Profile() if args.profile else None
    queue = iter(range(args.requests))
    statuses: list[int] = []

    async def worker() -> None:
        for _ in queue:
            statuses.append(await one_request(app.forwarder, body))

    cpu0, wall0 = time.process_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    if profiler:
        profiler.disable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await app.core.stop()
    bad = sum(1 for s in statuses if s != 200)
    kind = "streaming (64 events)" if args.stream else "non-streaming"
    print(
        f"{args.requests} {kind} requests at concurrency {args.concurrency}, "
        f"policy {args.policy}, {len(prompt_of(args.prompt_chars))}-character prompt: "
        f"{1e6 * cpu / args.requests:.0f} us CPU per request "
        f"(proxy handler + upstream client + this driver), {args.requests / wall:.0f} req/s "
        f"wall, {bad} non-200"
    )
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--policy", default="round_robin")
    p.add_argument(
        "--prompt-chars", type=int, default=None, help="send a prompt of this many characters"
    )
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    import uvloop

    ports = [free_port(), free_port()]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "fast_fake_vllm.py"), "--port", str(p)],
            stdout=subprocess.DEVNULL,
        )
        for p in ports
    ]
    try:
        uvloop.run(run(args, ports))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
