"""The proxy's memory while it serves one very large answer, on loopback.

Starts a backend in this process that answers one request with --mb megabytes, and
`fleet-proxy serve` in front of it as a child process; sends one small request (warm-up), then
the large one, reads its answer to the end while sampling the proxy's resident memory (VmRSS)
every 20 ms, and prints the proxy's RSS before, at its peak and after.

    python scripts/large_answer_rss.py --mode json --mb 100
    python scripts/large_answer_rss.py --mode sse --mb 100

--mode json: a non-streamed answer of --mb MB, written 1 MiB at a time with its Content-Length.
--mode sse: a streamed answer whose first SSE event never ends (no blank line): --mb MB of it,
then the backend stays silent until the proxy gives up on it.

The run is bounded by --timeout seconds; the proxy is stopped by its PID on every exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from localproc import ChildExited, free_ports, process, wait_http  # scripts/ is on sys.path

MODEL = "rss-model"
MIB = 1024 * 1024


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def backend_app(mode: str, size: int) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def metrics(_: web.Request) -> web.Response:
        # The gauges the proxy scrapes to count a backend routable.
        text = "".join(
            f'vllm:{name}{{engine="0",model_name="{MODEL}"}} {value}\n'
            for name, value in (
                ("num_requests_running", 0.0),
                ("num_requests_waiting", 0.0),
                ("kv_cache_usage_perc", 0.1),
            )
        )
        return web.Response(text=text, content_type="text/plain")

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("prompt") == "warm-up":
            return web.json_response({"id": "w", "choices": [{"index": 0, "text": "ok"}]})
        piece = b"x" * MIB
        if mode == "json":
            resp = web.StreamResponse(headers={"content-type": "application/json"})
            resp.content_length = size
            await resp.prepare(request)
            for start in range(0, size, MIB):
                await resp.write(piece[: min(MIB, size - start)])
            await resp.write_eof()
            return resp
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"text":"')
        for _ in range(size // MIB):
            await resp.write(piece)
        await asyncio.sleep(3600)  # never ends the event: the proxy must give up on it
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", generate)
    return app


async def measure(args: argparse.Namespace, log: Path) -> None:
    backend_port, proxy_port = free_ports(1)
    runner = web.AppRunner(backend_app(args.mode, args.mb * MIB), handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", backend_port).start()
    cmd = [sys.executable, "-m", "proxy.serving.cli", "serve", "--port", str(proxy_port),
           "--backend", f"http://127.0.0.1:{backend_port}", "--log-level", "warning"]  # fmt: skip
    try:
        with process(cmd, log) as proxy:
            url = f"http://127.0.0.1:{proxy_port}"
            await asyncio.to_thread(wait_http, url + "/ready", 60.0, proc=proxy, log=log)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
                warm = {"model": MODEL, "prompt": "warm-up", "max_tokens": 1}
                async with http.post(url + "/v1/completions", json=warm) as r:
                    await r.read()
                before = rss_mb(proxy.pid)
                peak = before
                done = asyncio.Event()

                async def sample() -> None:
                    nonlocal peak
                    while not done.is_set():
                        peak = max(peak, rss_mb(proxy.pid))
                        await asyncio.sleep(0.02)

                sampler = asyncio.create_task(sample())
                body = {"model": MODEL, "prompt": "large", "max_tokens": 1,
                        "stream": args.mode == "sse"}  # fmt: skip
                started = time.perf_counter()
                received = 0
                outcome = ""
                try:
                    async with http.post(url + "/v1/completions", json=body) as r:
                        async for chunk in r.content.iter_any():
                            received += len(chunk)
                        outcome = f"HTTP {r.status}"
                except aiohttp.ClientError as e:
                    outcome = f"{type(e).__name__}: {e}"
                seconds = time.perf_counter() - started
                done.set()
                await sampler
                await asyncio.sleep(0.5)
                after = rss_mb(proxy.pid)
    finally:
        await runner.cleanup()
    print(
        f"mode {args.mode}, {args.mb} MB from the backend: client got {received:,} bytes "
        f"in {seconds:.1f} s ({outcome}); proxy RSS {before:.0f} MB before, {peak:.0f} MB "
        f"peak (+{peak - before:.0f} MB), {after:.0f} MB after"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mode", choices=("json", "sse"), default="json")
    p.add_argument("--mb", type=int, default=100, help="megabytes the backend sends")
    p.add_argument("--timeout", type=float, default=120.0, help="bound on the whole run")
    args = p.parse_args()
    if args.mb < 1:
        p.error("--mb must be positive")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "proxy.log"

        async def bounded() -> None:
            async with asyncio.timeout(args.timeout):
                for tries_left in (2, 1, 0):
                    try:
                        return await measure(args, log)
                    except ChildExited as e:
                        # Its free port can be taken before it binds (by a connection's
                        # ephemeral port): a bind error gets fresh ports.
                        if tries_left == 0 or "address already in use" not in str(e):
                            raise

        try:
            asyncio.run(bounded())
        except TimeoutError:
            with contextlib.suppress(OSError):
                print(log.read_text()[-2000:], file=sys.stderr)
            raise SystemExit(f"no result within --timeout {args.timeout:g} s") from None


if __name__ == "__main__":
    main()
