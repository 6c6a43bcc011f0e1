"""The proxy's memory under many large request bodies at once.

Starts a slow vLLM-shaped backend (this script with --serve-backend: it reads each body, waits
--hold seconds, answers) and `fleet-proxy serve` in front of it, as child processes; the proxy
runs from --root (another checkout to compare, a worktree of an older commit, say). Sends
--requests concurrent completions whose bodies are --body-mb MB each, samples the proxy's
resident memory (VmRSS) every 20 ms, and prints the answers by status with the memory before,
at its peak and after. The proxy's settings come from the environment (FLEET_PROXY_...).

    python scripts/perf/bench_body_pressure.py --requests 40 --body-mb 9.9
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from localproc import ROOT, ChildExited, free_ports, process, wait_http

MODEL = "fake-model"
ANSWER = {
    "id": "cmpl-x",
    "object": "text_completion",
    "model": MODEL,
    "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def backend(hold: float) -> web.Application:
    async def completions(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(hold)
        return web.json_response(ANSWER)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", ok)
    return app


def memory_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


async def run(args: argparse.Namespace, root: Path) -> None:
    backend_port, proxy_port = free_ports(1)
    cmd = [
        sys.executable, "-P", "-m", "proxy.serving.cli", "serve", "--port", str(proxy_port),
        "--backend", f"http://127.0.0.1:{backend_port}", "--log-level", "warning",
    ]  # fmt: skip
    env = {"PYTHONPATH": str(root)}  # with -P: the proxy's code is --root's, not this checkout's
    logs = Path(tempfile.mkdtemp(prefix="body-pressure-"))
    slow = [
        sys.executable,
        __file__,
        "--serve-backend",
        str(backend_port),
        "--hold",
        str(args.hold),
    ]
    os.chdir(root)
    with (
        process(slow, logs / "backend.log") as slow_backend,
        process(cmd, logs / "fleet-proxy.log", env=env) as proxy,
    ):
        await asyncio.to_thread(
            wait_http, f"http://127.0.0.1:{backend_port}/health", 60, proc=slow_backend
        )
        await asyncio.to_thread(wait_http, f"http://127.0.0.1:{proxy_port}/ready", 60, proc=proxy)
        pad = "x" * int(args.body_mb * 1_000_000)
        bodies = [
            b'{"model": "%s", "max_tokens": 1, "prompt": "%d %s"}'
            % (MODEL.encode(), i, pad.encode())
            for i in range(args.requests)
        ]
        before = memory_kb(proxy.pid, "VmRSS")
        peak = before
        done = False

        async def sample() -> None:
            nonlocal peak
            while not done:
                peak = max(peak, memory_kb(proxy.pid, "VmRSS"))
                await asyncio.sleep(0.02)

        url = f"http://127.0.0.1:{proxy_port}/v1/completions"
        timeout = aiohttp.ClientTimeout(total=120)
        said: dict[int, str] = {}
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def send(body: bytes) -> int:
                headers = {"content-type": "application/json"}
                async with session.post(url, data=body, headers=headers) as r:
                    answer = await r.read()
                    if r.status != 200:  # the first error message by status
                        said.setdefault(r.status, answer[:300].decode("utf-8", "replace"))
                    return r.status

            sampler = asyncio.create_task(sample())
            started = time.perf_counter()
            statuses = await asyncio.gather(*(send(b) for b in bodies))
            took = time.perf_counter() - started
            done = True
            await sampler
        after = memory_kb(proxy.pid, "VmRSS")
        hwm = memory_kb(proxy.pid, "VmHWM")
    print(f"root: {root}")
    print(
        f"{args.requests} requests of {args.body_mb} MB in {took:.1f} s: {dict(Counter(statuses))}"
    )
    for status, message in sorted(said.items()):
        print(f"  {status}: {message}")
    print(
        f"proxy RSS: {before / 1024:.0f} MB before, {max(peak, hwm) / 1024:.0f} MB peak, "
        f"{after / 1024:.0f} MB after"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--body-mb", type=float, default=9.9)
    p.add_argument("--hold", type=float, default=2.0, help="seconds the backend holds each request")
    p.add_argument("--root", default=str(ROOT), help="the checkout whose proxy runs")
    p.add_argument("--serve-backend", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_backend:
        web.run_app(backend(args.hold), host="127.0.0.1", port=args.serve_backend, print=None)
        return
    for tries_left in (2, 1, 0):
        try:
            asyncio.run(run(args, Path(args.root).resolve()))
            return
        except ChildExited:  # its port taken between free_ports and its start, say
            if not tries_left:
                raise


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
