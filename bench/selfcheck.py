"""Can this client drive the load it is asked to? A closed loop of short streaming requests
against the fake server in its own process, reporting requests/s, the client's CPU per
request, and the rate one core of client could sustain at that cost.

A Python load generator that saturates its core reports the client's latency, not the
server's; run this on the benchmark machine before trusting high-rate results.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import replace

from bench.event_loop import run_loop
from bench.records import RequestRecord
from bench.runner import Replay, RunOptions
from bench.summary import summarize
from bench.synthetic import chat_sessions


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleet-proxy bench selfcheck")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--output-tokens", type=int, default=4)
    p.add_argument("--min-rps", type=float, default=1000.0)
    return p


def selfcheck_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    server = subprocess.Popen(
        [sys.executable, "-m", "bench", "fake-server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("PORT "):
            print("fake server did not start", file=sys.stderr)
            return 2
        port = int(line.split()[1])
        workload = chat_sessions(
            sessions=args.requests,
            turns=(1, 1),
            system_tokens=0,
            user_tokens=(16, 16),
            output_tokens=(args.output_tokens, args.output_tokens),
        )
        records: list[RequestRecord] = []
        opts = RunOptions(
            base_url=f"http://127.0.0.1:{port}",
            model="fake",
            mode="closed",
            concurrency=args.concurrency,
        )
        cpu0, wall0 = time.process_time(), time.perf_counter()
        run_loop(Replay(replace(opts), "selfcheck", 0, records.append).run(workload))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        server.terminate()
        server.wait(timeout=10)
    s = summarize(records)
    rps = s["throughput"]["requests_per_s"] or 0.0
    per_request = cpu / max(1, len(records))
    # What one core of client could sustain: the observed rate also depends on the fake
    # server and on whatever else shares the machine.
    capacity = 1.0 / per_request if per_request else float("inf")
    print(
        f"{s['completed']}/{s['requests']} ok at concurrency {args.concurrency}, "
        f"{args.output_tokens} tokens each: {rps:,.0f} req/s observed; client CPU "
        f"{per_request * 1e6:,.0f} us/request ({cpu / wall:.0%} of one core), so one core of "
        f"client sustains ~{capacity:,.0f} req/s; TTFT p50 {s['ttft_ms']['p50']:.2f} ms"
    )
    if capacity < args.min_rps or s["errors"]:
        print(f"client capacity below {args.min_rps:,.0f} req/s or errors", file=sys.stderr)
        return 1
    return 0
