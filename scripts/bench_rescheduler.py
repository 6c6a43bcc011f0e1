#!/usr/bin/env python
"""Benchmark: the rescheduler off against on, on simulated H100 engines, with a skewed,
bursty, long-output workload.

    .venv/bin/python scripts/bench_rescheduler.py [--fleet aggregated|pd] [--repeat 3]
        [--speed 0.25] [--duration 60] [--out DIR]

The skew: requests arrive in bursts, and every `engines`-th request is long (a long prompt
and a long answer), the rest short. Dispatch is round-robin, so every long request lands on
the same engine, which is what a dispatcher that cannot know output lengths does to a fleet
now and then; that engine's batch grows, its decode steps slow down, and its requests' tails
grow, while the other engines idle.

Fleets (a fresh fleet and a fresh fleet-proxy per run, settings alternated):
- `aggregated`: 4 engines in role `both`; `on` adds the `neutral_load` and
  `neutral_failover` policies with the projected-KV load metric;
- `pd`: 2 prefill + 2 decode engines in orchestrated P/D, decode legs dealt round-robin;
  `on` adds `binpacking_mitigation` and `binpacking_consolidation` against a TPOT SLO,
  and the bench counts TPOT SLO attainment.

Writes `rescheduler.md` (pooled latencies, migrations, paired 95% intervals of the
per-run percentiles) and every run's bench bundle under `runs/`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench.artifacts import read_records  # noqa: E402
from bench.paired import paired_difference  # noqa: E402
from bench.summary import dig  # noqa: E402

sb = importlib.import_module("sim_bench")  # scripts/ is on sys.path, above

SETTINGS = ("off", "on")
ENGINES = 4


def skewed_trace(
    *, duration_s: float, burst_every_s: float, burst: int, engines: int, seed: int
) -> list[dict[str, Any]]:
    """Mooncake-format lines: bursts of `burst` requests every `burst_every_s` (jittered);
    request i is long when i % engines == 0. Prompts are unique (no shared prefix), so the
    prefix cache favours no engine."""
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = []
    t, i, block = 0.0, 0, 0
    while t < duration_s:
        for k in range(burst):
            long = i % engines == 0
            n_in = rng.randint(5000, 7000) if long else rng.randint(300, 900)
            n_out = rng.randint(300, 500) if long else rng.randint(60, 200)
            blocks = -(-n_in // 512)
            lines.append(
                {
                    "timestamp": round((t + k * 0.01) * 1000, 1),
                    "input_length": n_in,
                    "output_length": n_out,
                    "hash_ids": list(range(block, block + blocks)),
                }
            )
            block += blocks
            i += 1
        t += burst_every_s * rng.uniform(0.5, 1.5)
    return lines


def proxy_config(fleet: str, setting: str, backends: list[tuple[str, str]], args: Any) -> Any:
    config: dict[str, Any] = {"backends": [{"url": u, "role": r} for u, r in backends]}
    if fleet == "pd":
        # The engines pull KV over (simulated) NIXL: a move hands the KV over rather than
        # prefilling it again on a decode engine, where it would slow every decode.
        for b in config["backends"]:
            b["labels"] = {"kv_connector": "nixl"}
    if fleet == "aggregated":
        config["policy"] = "round_robin"
    else:
        pd = importlib.import_module("bench_pd")
        routing = orjson.loads(orjson.dumps(pd.PD_ROUTING))
        routing["plugins"].append({"type": "round-robin-picker", "name": "rr"})
        for profile in routing["profiles"]:
            if profile["name"] == "decode":
                profile["picker"] = "rr"
        config["routing"] = routing
    if setting == "on":
        config |= {
            "enable_rescheduling": True,
            "rescheduling_interval_ms": args.interval_ms,
            "rescheduling_migration_timeout": 30,
        }
        if fleet == "aggregated":
            config |= {
                "rescheduling_policies": ["neutral_load", "neutral_failover"],
                "rescheduling_neutral_load_metric": "kv_cache_usage_ratio_projected",
                "rescheduling_neutral_load_threshold": args.threshold,
                "rescheduling_load_balance_threshold": args.min_difference,
                "rescheduling_req_select_order": args.order,
                "rescheduling_req_select_rule": args.rule,
                "rescheduling_req_select_value": args.value,
            }
        else:
            config |= {
                "rescheduling_policies": args.pd_policies.split(","),
                "tpot_slo": args.tpot_slo_ms,
            }
    return config


def migrations(port: int) -> dict[str, float]:
    """The proxy's migration and rescheduling counters at the end of a run."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    keep = (
        "fleet_proxy_migrations_total",
        "fleet_proxy_migrations_by_kind_total",
        "fleet_proxy_rescheduling_",
    )
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(keep) and not line.startswith("#") and "_created" not in line
    }


def run_setting(setting: str, k: int, args: Any, trace: Path, out: Path) -> Path:
    tag = f"{setting}-{k}"
    logs = out / "logs"
    bundle = out / "runs" / tag
    bundle.mkdir(parents=True, exist_ok=True)
    roles = ["both", "both"] if args.fleet == "aggregated" else ["prefill", "decode"]
    load_before = os.getloadavg()
    started = time.time()
    sims, backends = sb.start_sims(args, logs, tag, roles)
    proxy = None
    try:
        config_file = bundle / "proxy.yaml"
        config = proxy_config(args.fleet, setting, backends, args)
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        proxy, port = sb.start_proxy(config_file, logs / f"{tag}-proxy.log")
        urls = [u for u, _ in backends]
        bench_args = [
            "--target", f"{setting}=http://127.0.0.1:{port}", "--model", args.model,
            "--api", "completions", "--workload", "mooncake", "--trace", str(trace),
            "--timeout", "600", "--backend-metrics", *urls, "--out", str(bundle),
            "--router-setting", f"rescheduler={setting}", "--no-progress",
            "--slo", f"tpot:{args.tpot_slo_ms / args.speed:.0f}",
        ]  # fmt: skip
        sb.run_bench(bundle, bench_args, setting)
        sb.write_machine(bundle, started, load_before, urls, proxy=migrations(port))
    finally:
        if proxy is not None:
            proxy.stop()
        for s in sims:
            s.stop()
    return bundle


def _moved(machine: dict[str, Any]) -> float:
    return sum(
        float(v)
        for key, v in machine["proxy"].items()
        if key.startswith("fleet_proxy_migrations_total") and 'outcome="ok"' in key
    )


def tables(bundles: dict[str, list[Path]]) -> tuple[str, dict[str, Any]]:
    pooled: dict[str, Any] = {}
    lines = [
        "| setting | runs | requests ok | errors | moved | E2E p50 | E2E p90 | E2E p99 "
        "| TTFT p99 | TPOT p50 | TPOT p99 | TPOT SLO met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, paths in bundles.items():
        records = [r for p in paths for r in read_records(p / "metrics.jsonl")]
        ok = [r for r in records if r.ok]
        e2e = [r.e2e_s * 1000 for r in ok if r.e2e_s is not None]
        ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
        tpot = [r.tpot_s * 1000 for r in ok if r.tpot_s is not None]
        met = [dig(sb.summary_of(p), "slo", "attainment") for p in paths]
        moved = sum(_moved(orjson.loads((p / "machine.json").read_bytes())) for p in paths)
        attained = [m for m in met if m is not None]
        row: dict[str, Any] = {
            "requests": len(records),
            "ok": len(ok),
            "errors": len(records) - len(ok),
            "moved": moved,
            "e2e_ms": {q: sb.pct(e2e, q) for q in (50, 90, 99)},
            "ttft_p99_ms": sb.pct(ttft, 99),
            "tpot_ms": {q: sb.pct(tpot, q) for q in (50, 99)},
            "tpot_slo_attainment": sum(attained) / len(attained) if attained else None,
        }
        pooled[label] = row
        slo = row["tpot_slo_attainment"]
        lines.append(
            f"| {label} | {len(paths)} | {len(ok)} | {row['errors']} | {moved:.0f} | "
            + " | ".join(sb.fmt(row["e2e_ms"][q], 0) for q in (50, 90, 99))
            + f" | {sb.fmt(row['ttft_p99_ms'], 0)} | {sb.fmt(row['tpot_ms'][50], 1)} | "
            f"{sb.fmt(row['tpot_ms'][99], 1)} | "
            f"{sb.fmt(slo * 100 if slo is not None else None, 1)}% |"
        )
    lines += ["", "Latencies in ms of wall time, pooled over every run of the setting.", ""]
    a, b = SETTINGS
    n = min(len(bundles[a]), len(bundles[b]))
    pairs: dict[str, Any] = {}
    if n >= 2:
        lines += [
            f"Paired runs (n = {n}), B = {b} vs A = {a}: mean of per-run (B - A), 95% CI.",
            "",
            "| metric | A mean | B mean | B - A | 95% CI | relative | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for path in (
            ("e2e_ms", "p50"), ("e2e_ms", "p90"), ("e2e_ms", "p99"), ("ttft_ms", "p99"),
            ("tpot_ms", "p50"), ("tpot_ms", "p99"), ("slo", "attainment"),
        ):  # fmt: skip
            va = [dig(sb.summary_of(p), *path) for p in bundles[a][:n]]
            vb = [dig(sb.summary_of(p), *path) for p in bundles[b][:n]]
            if any(v is None for v in va + vb):
                continue
            d = paired_difference(va, vb).to_json()
            name = " ".join(path)
            pairs[name] = d
            rel = f"{d['relative'] * 100:+.1f}%" if d["relative"] is not None else "-"
            ci = "-" if d["ci_low"] is None else f"[{d['ci_low']:.2f}, {d['ci_high']:.2f}]"
            lines.append(
                f"| {name} | {d['mean_a']:.2f} | {d['mean_b']:.2f} | {d['mean_diff']:+.2f} | "
                f"{ci} | {rel} | {d['verdict']} |"
            )
    lines += [
        "",
        "| run | start UTC | load 1-min before / after | sim lag % (worst) | moved | E2E p99 "
        "| TPOT p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, paths in bundles.items():
        for k, p in enumerate(paths):
            m = orjson.loads((p / "machine.json").read_bytes())
            lags = [x for x in m["sim_lag_fraction"] if x is not None]
            run = sb.summary_of(p)
            lines.append(
                f"| {label} {k} | {m['started_utc']} | {m['load_before'][0]:.1f} / "
                f"{m['load_after'][0]:.1f} | {sb.fmt(max(lags) * 100 if lags else None, 1)} | "
                f"{_moved(m):.0f} | {sb.fmt(dig(run, 'e2e_ms', 'p99'), 0)} | "
                f"{sb.fmt(dig(run, 'tpot_ms', 'p99'), 1)} |"
            )
    return "\n".join(lines), {"pooled": pooled, "paired": pairs}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--fleet", choices=("aggregated", "pd"), default="aggregated")
    p.add_argument("--speed", type=float, default=0.25, help="simulator clock speed")
    p.add_argument("--profile", default="h100-llama-8b")
    p.add_argument("--model", default="sim-llama-8b")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--duration", type=float, default=30.0, help="trace seconds (wall time)")
    p.add_argument("--burst", type=int, default=8, help="requests per burst")
    p.add_argument("--burst-every", type=float, default=1.0, help="wall seconds between bursts")
    p.add_argument("--threshold", type=float, default=0.2, help="neutral load threshold")
    p.add_argument("--min-difference", type=float, default=0.1, help="least load gap moved")
    p.add_argument("--order", default="FCWSR", help="rescheduling_req_select_order (aggregated)")
    p.add_argument("--rule", default="TOKEN", help="rescheduling_req_select_rule (aggregated)")
    p.add_argument("--value", type=float, default=16384, help="rescheduling_req_select_value")
    p.add_argument("--tpot-slo-ms", type=float, default=50.0, help="engine ms (pd fleet)")
    p.add_argument(
        "--pd-policies",
        default="binpacking_mitigation,binpacking_consolidation",
        help="rescheduling_policies (pd fleet)",
    )
    p.add_argument("--interval-ms", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs") / time.strftime("resched-%H%M%S"))
    args = p.parse_args(argv)
    out: Path = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    lines = skewed_trace(
        duration_s=args.duration,
        burst_every_s=args.burst_every,
        burst=args.burst,
        engines=2 if args.fleet == "pd" else ENGINES,
        seed=args.seed,
    )
    trace = out / "trace.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    bundles = sb.run_alternating(
        SETTINGS, args.repeat, lambda setting, k: run_setting(setting, k, args, trace, out)
    )
    table, data = tables(bundles)
    command = " ".join(["scripts/bench_rescheduler.py", *argv])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = (
        f"# Rescheduler off vs on, {args.fleet} fleet ({when})\n\n`{command}`\n\n"
        f"speed {args.speed}, profile {args.profile}, {len(lines)} requests\n\n{table}\n"
    )
    sb.write_report(out, "rescheduler", text, data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
