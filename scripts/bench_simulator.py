"""How many concurrent streams one simulator process holds before its clock falls behind.

Starts `fleet-proxy sim` as its own process (loopback only), opens --streams streaming
completions spread over its engines, waits until every stream has produced a token, then
holds them for --hold seconds and reports how far the engines' clocks fell behind real time
over that window: 1 - (engine seconds) / (real seconds) while busy, summed over engines, and
how far each engine clock trailed real time when sampled every 0.5 s (milliseconds). The
client runs in this process, so simulator and client share the machine's two cores, as a
router benchmark would. Bounded: one request per stream, a deadline on every phase.

    .venv/bin/python scripts/bench_simulator.py --streams 2000 --engines 8 --hold 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from simulator.profiles import load_profile

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = "import sys; from simulator.cli import main; sys.exit(main(sys.argv[1:]))"
# The same under cProfile, the stats written to argv[1] on exit.
LAUNCH_PROFILED = (
    "import cProfile, sys; from simulator.cli import main; p = cProfile.Profile();"
    " p.enable(); rc = main(sys.argv[2:]); p.disable();"
    " p.dump_stats(sys.argv[1]); sys.exit(rc)"
)


class Stream:
    __slots__ = ("chunks", "error", "started")

    def __init__(self) -> None:
        self.chunks = 0
        self.started = asyncio.Event()
        self.error: str | None = None


async def _one_stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], st: Stream
) -> None:
    try:
        async with http.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                st.error = f"HTTP {r.status}"
                return
            async for data in r.content.iter_any():
                st.chunks += data.count(b"data: ")
                st.started.set()
    except (aiohttp.ClientError, TimeoutError) as e:
        st.error = type(e).__name__
    finally:
        st.started.set()


async def _states(http: aiohttp.ClientSession, urls: list[str]) -> list[dict[str, Any]]:
    out = []
    for u in urls:
        async with http.get(u + "/_sim/state") as r:
            out.append(await r.json())
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _lag(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> float:
    planned = sum(
        a["planned_busy_s"] - b["planned_busy_s"] for a, b in zip(after, before, strict=True)
    )
    actual = sum(
        a["actual_busy_s"] - b["actual_busy_s"] for a, b in zip(after, before, strict=True)
    )
    return 0.0 if actual <= 0 else max(0.0, 1.0 - planned / actual)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        *([LAUNCH_PROFILED, args.cprofile] if args.cprofile else [LAUNCH]),
        "--engines",
        str(args.engines),
        "--base-port",
        "0",
        "--profile",
        args.profile,
        "--speed",
        str(args.speed),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    tasks: list[asyncio.Task[None]] = []
    try:
        urls = [
            (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
            for _ in range(args.engines)
        ]
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            prompt = "word " * args.prompt_tokens
            max_tokens = args.max_tokens or (
                load_profile(args.profile).max_model_len - 2 * args.prompt_tokens
            )
            body = {
                "model": "sim-llama-8b",
                "prompt": prompt,
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
            }
            streams = [Stream() for _ in range(args.streams)]
            t0 = time.monotonic()
            for i, st in enumerate(streams):
                tasks.append(asyncio.create_task(_one_stream(http, urls[i % len(urls)], body, st)))
                if i % 100 == 99:
                    await asyncio.sleep(0.05)  # ramp without a connect storm
            await asyncio.wait_for(
                asyncio.gather(*(s.started.wait() for s in streams)), args.ramp_timeout
            )
            ramp_s = time.monotonic() - t0
            errors = [s.error for s in streams if s.error]
            before = await _states(http, urls)
            chunks_before = sum(s.chunks for s in streams)
            cpu0 = _cpu_seconds(proc.pid)
            w0 = time.monotonic()
            behind: list[float] = []  # real seconds each engine's clock trails, sampled
            while time.monotonic() - w0 < args.hold:
                await asyncio.sleep(0.5)
                behind.extend(s["behind_s"] / args.speed for s in await _states(http, urls))
            after = await _states(http, urls)
            window = time.monotonic() - w0
            sim_cpu = (_cpu_seconds(proc.pid) - cpu0) / window
            chunks = sum(s.chunks for s in streams) - chunks_before
            tokens = sum(
                a["generation_tokens"] - b["generation_tokens"]
                for a, b in zip(after, before, strict=True)
            )
            alive = sum(1 for t in tasks if not t.done())
            held = sum(s["running"] + s["waiting"] for s in after)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.5)
            drained = await _states(http, urls)
        return {
            "streams": args.streams,
            "engines": args.engines,
            "profile": args.profile,
            "speed": args.speed,
            "ramp_s": round(ramp_s, 2),
            "errors": len(errors),
            "error_kinds": sorted(set(errors)),
            "open_streams_at_end": alive,
            "engine_requests_at_end": held,
            "running_per_engine": [s["running"] for s in after],
            "window_s": round(window, 2),
            "chunks_per_s": round(chunks / window),
            "clock_lag": round(_lag(before, after), 4),
            "behind_ms_p50": round(1000 * statistics.median(behind), 1),
            "behind_ms_max": round(1000 * max(behind), 1),
            "sim_cpu_cores": round(sim_cpu, 2),
            "load_average_1m": os.getloadavg()[0],
            "tokens_per_s": round(tokens / window),
            "sim_cpu_us_per_token": round(1e6 * sim_cpu * window / max(1, tokens), 1),
            "requests_left_after_close": sum(s["running"] + s["waiting"] for s in drained),
        }
    finally:
        for t in tasks:
            t.cancel()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 20)
            if proc.returncode is None:
                proc.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--profile", default="h100-llama-8b")
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="tokens per stream (default: as many as the context allows)",
    )
    p.add_argument("--hold", type=float, default=20.0, help="seconds to hold all streams")
    p.add_argument("--ramp-timeout", type=float, default=120.0)
    p.add_argument("--cprofile", default="", help="write the simulator's cProfile stats here")
    args = p.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result))
    ok = result["clock_lag"] < 0.10 and result["errors"] == 0
    print(
        f"{result['streams']} streams on {result['engines']} engines ({result['profile']}, "
        f"speed {result['speed']}): clock behind real time by {100 * result['clock_lag']:.1f}%"
        f", {result['chunks_per_s']} chunks/s -> {'OK' if ok else 'over target'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
