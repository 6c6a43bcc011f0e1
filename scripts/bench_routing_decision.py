"""Cost of one routing decision (`policy.pick`) alone, at 8, 64 and 256 backends.

The fleet is synthetic but busy: every backend has live load (in flight, pending prefill,
decoding) and a scraped snapshot with cache_config_info; the prefix index is warmed with
multi-turn sessions that share a system prompt, and each measured request is the next turn of
one of them (a prompt of a few thousand characters). Metrics are bound, as in the proxy, so the
figures include the EPP metrics' cost. Each decision is timed on its own, in wall time
(perf_counter_ns) and in this thread's CPU time (thread_time_ns): on a shared machine the
wall-time tail is mostly the neighbours' time slices, the CPU time is the decision's own cost.

    .venv/bin/python scripts/bench_routing_decision.py [--decisions 3000] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from typing import Any

from prometheus_client import CollectorRegistry

from fleet.types import Backend, BackendSpec, EngineMetrics, Load, MetricsSnapshot
from policies.policy import Policy, RequestContext
from policies.registry import build_policy, build_routing

MODEL = "bench-model"
SIZES = (8, 64, 256)
POLICIES = (
    "round_robin",
    "least_requests",
    "power_of_two",
    "lmetric",
    "unified",
    "autellix",
    "prefix_aware",
    "epp_yaml",
)
SYSTEM = "You are a helpful assistant for the fleet benchmark. " * 40  # ~2 KB shared prefix

EPP_YAML_LIKE: dict[str, Any] = {
    "name": "epp_yaml",
    "plugins": [
        {"type": "prefix-cache-affinity-filter", "name": "sticky"},
        {"type": "prefix-cache-scorer", "name": "prefix"},
        {"type": "queue-depth-scorer", "name": "queue"},
        {"type": "kv-cache-utilization-scorer", "name": "kv"},
        {"type": "session-affinity-scorer", "name": "session"},
        {"type": "no-hit-lru-scorer", "name": "nohit"},
        {"type": "max-score-picker", "name": "max", "params": {"seed": 1}},
    ],
    "profiles": [
        {
            "name": "default",
            "filters": ["sticky"],
            "scorers": [
                {"plugin": "prefix", "weight": 3},
                {"plugin": "queue", "weight": 2},
                {"plugin": "kv", "weight": 2},
                {"plugin": "session", "weight": 1},
                {"plugin": "nohit", "weight": 1},
            ],
            "picker": "max",
        }
    ],
}


def make_fleet(n: int, rng: random.Random) -> list[Backend]:
    fleet = []
    for i in range(n):
        spec = BackendSpec(
            id=f"10.0.{i // 250}.{i % 250}:8000",
            url=f"http://10.0.{i // 250}.{i % 250}:8000",
            models=(MODEL,),
        )
        running = rng.randint(0, 24)
        metrics = EngineMetrics(
            running=running,
            waiting=rng.randint(0, 6),
            kv_usage=rng.random(),
            block_size=16,
            num_gpu_blocks=20_000,
        )
        load = Load(
            in_flight=running + rng.randint(0, 4),
            pending_prefill_tokens=rng.randint(0, 8000),
            running_decodes=running,
        )
        fleet.append(
            Backend(spec=spec, load=load, snapshot=MetricsSnapshot(taken_at=0.0, metrics=metrics))
        )
    return fleet


def turn_text(session: int, turn: int) -> str:
    parts = [SYSTEM]
    for t in range(turn + 1):
        parts.append(f"user: session {session} question {t} " + "lorem ipsum " * 30 + "\n")
        parts.append(f"assistant: answer {t} for {session} " + "dolor sit amet " * 20 + "\n")
    return "".join(parts)


def context(text: str, session: int, debug: bool) -> RequestContext:
    return RequestContext(
        request_id="bench",
        endpoint="chat/completions",
        model=MODEL,
        body={},
        headers={},
        stream=True,
        prompt_text=text,
        prompt_tokens=len(text) // 4,
        session_id=f"s{session}",
        program_id=f"s{session}",
        debug=debug,
    )


def build(name: str) -> Policy:
    policy = build_routing(EPP_YAML_LIKE) if name == "epp_yaml" else build_policy(name)
    policy.bind_metrics(CollectorRegistry(), dict)  # with its metrics on, as in the proxy
    return policy


def one_run(
    name: str, size: int, decisions: int, sessions: int, seed: int, system_everywhere: bool
) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    fleet = make_fleet(size, rng)
    policy = build(name)
    if system_everywhere:  # as after a while in service: every backend has the system prompt
        for b in fleet:
            policy.pick(context(SYSTEM, -1, False), [b], 0.0)
    turns = [0] * sessions
    for s in range(sessions):  # warm the index and the affinity tables: every session's turn 0
        policy.pick(context(turn_text(s, 0), s, False), fleet, 0.0)
    ctxs = []
    for _ in range(decisions):
        s = rng.randrange(sessions)
        turns[s] = (turns[s] + 1) % 6
        ctxs.append(context(turn_text(s, turns[s]), s, debug=False))
    wall: list[int] = []
    cpu: list[int] = []
    gc.collect()
    gc.disable()
    try:
        for i, ctx in enumerate(ctxs):
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            policy.pick(ctx, fleet, float(i))
            wall.append(time.perf_counter_ns() - t0)
            cpu.append(time.thread_time_ns() - c0)
    finally:
        gc.enable()
    wall.sort()
    cpu.sort()
    return wall, cpu


def pct(sorted_ns: list[int], q: float) -> float:
    return round(sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1000, 1)


def measure(
    name: str,
    size: int,
    decisions: int,
    sessions: int,
    seed: int,
    repeats: int,
    system_everywhere: bool = False,
) -> dict[str, Any]:
    """The least disturbed of `repeats` runs (lowest p99): on a shared machine the others are
    mostly measuring the neighbours."""
    best: tuple[list[int], list[int]] | None = None
    for r in range(repeats):
        wall, cpu = one_run(name, size, decisions, sessions, seed + r, system_everywhere)
        if best is None or pct(wall, 0.99) < pct(best[0], 0.99):
            best = (wall, cpu)
    assert best is not None
    wall, cpu = best
    return {
        "policy": name,
        "backends": size,
        "decisions": decisions,
        "mean_us": round(statistics.fmean(wall) / 1000, 1),
        "p50_us": pct(wall, 0.5),
        "p99_us": pct(wall, 0.99),
        "max_us": pct(wall, 1.0),
        "cpu_p50_us": pct(cpu, 0.5),
        "cpu_p99_us": pct(cpu, 0.99),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument(
        "--system-everywhere",
        action="store_true",
        help="record the shared system prompt on every backend before the sessions' first "
        "turns (else it starts on the first backend a policy sends a session to)",
    )
    args = ap.parse_args(argv)
    rows = []
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("| policy | backends | mean us | p50 us | p99 us | max us | CPU p50 us | CPU p99 us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.policies.split(","):
        for size in (int(x) for x in args.sizes.split(",")):
            row = measure(
                name,
                size,
                args.decisions,
                args.sessions,
                args.seed,
                args.repeats,
                args.system_everywhere,
            )
            rows.append(row)
            keys = ("mean_us", "p50_us", "p99_us", "max_us", "cpu_p50_us", "cpu_p99_us")
            cells = " | ".join(str(row[k]) for k in keys)
            print(f"| {name} | {size} | {cells} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            meta = {"python": sys.version.split()[0], "loadavg": os.getloadavg()}
            json.dump({**meta, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
