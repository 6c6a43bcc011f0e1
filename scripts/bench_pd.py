#!/usr/bin/env python
"""Benchmark: prefill/decode disaggregation against aggregated serving at equal
engine count, on simulated H100 engines, with long prompts.

    .venv/bin/python scripts/bench_pd.py [--speed 0.25] [--repeat 3] [--out DIR] [-- BENCH ARGS]

Settings (4 engines each, a fresh fleet and a fresh fleet-proxy per run, alternating):
- `aggregated`: 4 engines in role `both`, the proxy's `lmetric` policy;
- `disaggregated`: 2 prefill + 2 decode engines, the proxy's `disagg-profile-handler` in its
  default orchestrated mode (prefill leg, then the decode leg with the KV transfer params):
  prefill profile = prefix-cache + token-load scorers, max score; decode profile = LMetric;
  the selective decider with its defaults.
The engines run as two `fleet-proxy sim` processes of 2 engines in both settings, so the CPU
is shared the same way. Writes `pd.md` (TTFT and ITL p50/p90/p99 pooled over runs, paired
95% intervals per percentile), `pd.json`, and every run's bench bundle under `runs/`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
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

cp = importlib.import_module("compare_peers")  # scripts/ is on sys.path, above
sb = importlib.import_module("sim_bench")

SETTINGS = ("aggregated", "disaggregated")
# Single-turn requests with long, unique prompts (3k-12k tokens) and replies long enough
# for inter-token latency to mean something; Poisson arrivals so that prefills land while
# other requests decode, which is where aggregated engines interleave the two.
DEFAULT_BENCH_LINE = (
    "--workload chat --api completions --sessions 2000 --turns 1 --system-tokens 32 "
    "--user-tokens 3000-12000 --output-tokens 64-192 --arrival poisson --rate 1.2 "
    "--duration 60 --timeout 120 --slo ttft:4000 tpot:200"
)
PD_ROUTING: dict[str, Any] = {
    "plugins": [
        {"type": "prefill-endpoints-filter", "name": "prefill-only"},
        {"type": "decode-endpoints-filter", "name": "decode-only"},
        {"type": "prefix-cache-scorer", "name": "prefix"},
        {"type": "token-load-scorer", "name": "tokens"},
        {"type": "max-score-picker", "name": "best"},
        {"type": "lmetric-picker", "name": "lmetric"},
        {"type": "disagg-profile-handler", "name": "pd"},
    ],
    "profiles": [
        {
            "name": "prefill",
            "filters": ["prefill-only"],
            "scorers": ["prefix", "tokens"],
            "picker": "best",
        },
        {"name": "decode", "filters": ["decode-only"], "picker": "lmetric"},
    ],
    "handler": "pd",
}


def proxy_metrics(port: int) -> dict[str, float]:
    """The proxy's P/D counters (fleet_pd_decisions_total, prefill legs) at the end of a run."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("fleet_pd_decisions_total", "fleet_proxy_pd_prefill_legs_total"))
    }


def run_setting(
    setting: str, k: int, args: argparse.Namespace, bench_args: list[str], out: Path
) -> Path:
    tag = f"{setting}-{k}"
    logs = out / "logs"
    bundle = out / "runs" / tag
    bundle.mkdir(parents=True, exist_ok=True)
    roles = ["both", "both"] if setting == "aggregated" else ["prefill", "decode"]
    load_before = os.getloadavg()
    started = time.time()
    sims, backends = sb.start_sims(args, logs, tag, roles)
    proxy = None
    try:
        config: dict[str, Any] = {
            "backends": [{"url": u, "role": r} for u, r in backends],
            "routing": {"policy": "lmetric"} if setting == "aggregated" else PD_ROUTING,
        }
        config_file = bundle / "proxy.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        proxy, port = sb.start_proxy(config_file, logs / f"{tag}-proxy.log")
        urls = [u for u, _ in backends]
        sb.run_bench(
            bundle,
            [
                "--target", f"{setting}=http://127.0.0.1:{port}", "--model", args.model,
                "--backend-metrics", *urls, "--router-setting", f"setting={setting}",
                "--out", str(bundle), "--no-progress", *bench_args,
            ],
            setting,
        )  # fmt: skip
        sb.write_machine(bundle, started, load_before, urls, proxy_pd=proxy_metrics(port))
    finally:
        if proxy is not None:
            proxy.stop()
        for s in sims:
            s.stop()
    return bundle


ITL_BUCKET = "vllm:inter_token_latency_seconds_bucket"


def _buckets(path: Path) -> dict[float, float]:
    out: dict[float, float] = {}
    for line in path.read_text().splitlines():
        if line.startswith(ITL_BUCKET):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = out.get(float(le), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def engine_itl_buckets(bundle: Path) -> dict[float, float]:
    """The engines' own inter-token latency histogram (engine seconds), after minus before,
    summed over every engine of the run: what the engine model produced, before the proxy,
    the client and the shared CPU add their delays and bursts."""
    total: dict[float, float] = {}
    for after in bundle.glob("backend_metrics/*/*.after.prom"):
        before = after.with_name(after.name.replace(".after.", ".before."))
        b0 = _buckets(before) if before.exists() else {}
        for le, v in _buckets(after).items():
            total[le] = total.get(le, 0.0) + v - b0.get(le, 0.0)
    return total


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket the rank falls in."""
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] <= 0:
        return None
    rank = q * buckets[edges[-1]]
    lo_edge, lo_count = 0.0, 0.0
    for le in edges:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lo_edge
            span = buckets[le] - lo_count
            return lo_edge + (le - lo_edge) * ((rank - lo_count) / span if span else 1.0)
        lo_edge, lo_count = le, buckets[le]
    return None


def share_above(limit_s: float, buckets: dict[float, float]) -> float | None:
    """The share of inter-token gaps longer than `limit_s` (a bucket edge): the decode tokens
    that waited behind a long step, a prefill chunk in an aggregated engine."""
    total = buckets.get(float("inf"))
    if not total or limit_s not in buckets:
        return None
    return 1.0 - buckets[limit_s] / total


def tables(bundles: dict[str, list[Path]], speed: float) -> tuple[str, dict[str, Any]]:
    pooled: dict[str, Any] = {}
    lines = [
        "| setting | runs | requests ok | errors | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 "
        "| ITL p90 | ITL p99 | E2E p90 | output tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, paths in bundles.items():
        records = [r for p in paths for r in read_records(p / "metrics.jsonl")]
        ok = [r for r in records if r.ok]
        ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
        itl = [x * 1000 for r in ok for x in r.itl_s]
        e2e = [r.e2e_s * 1000 for r in ok if r.e2e_s is not None]
        tok_s = [dig(sb.summary_of(p), "throughput", "output_tokens_per_s") or 0.0 for p in paths]
        ttft_q = {q: sb.pct(ttft, q) for q in (50, 90, 99)}
        itl_q = {q: sb.pct(itl, q) for q in (50, 90, 99)}
        e2e_p90 = sb.pct(e2e, 90)
        rate = sum(tok_s) / len(tok_s) if tok_s else None
        errors = len(records) - len(ok)
        pooled[label] = {
            "ttft_ms": ttft_q,
            "itl_ms": itl_q,
            "e2e_p90_ms": e2e_p90,
            "requests_ok": len(ok),
            "errors": errors,
            "output_tokens_per_s": rate,
        }
        lines.append(
            f"| {label} | {len(paths)} | {len(ok)} | {errors} | "
            + " | ".join(sb.fmt(ttft_q[q], 0) for q in (50, 90, 99))
            + " | "
            + " | ".join(sb.fmt(itl_q[q], 1) for q in (50, 90, 99))
            + f" | {sb.fmt(e2e_p90, 0)} | {sb.fmt(rate, 0)} |"
        )
    lines += [
        "",
        "Latencies in ms of wall time, pooled over every run of the setting.",
        "",
        f"Engine side (engine ms; wall time = engine time / speed {speed}): TPOT from the "
        "client (mean gap per request, immune to bursts) x speed, and ITL from the engines' "
        "own `vllm:inter_token_latency_seconds` histograms (interpolated in vLLM's buckets).",
        "",
        "| setting | TPOT p50 | TPOT p90 | TPOT p99 | engine ITL p50 | engine ITL p90 "
        "| engine ITL p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, paths in bundles.items():
        records = [r for p in paths for r in read_records(p / "metrics.jsonl")]
        tpot = [r.tpot_s * 1000 * speed for r in records if r.ok and r.tpot_s is not None]
        hist: dict[float, float] = {}
        for p in paths:
            for le, v in engine_itl_buckets(p).items():
                hist[le] = hist.get(le, 0.0) + v
        itl_q = {q: histogram_quantile(q / 100, hist) for q in (50, 90, 99)}
        pooled[label]["tpot_engine_ms"] = {q: sb.pct(tpot, q) for q in (50, 90, 99)}
        pooled[label]["engine_itl_ms"] = {q: v * 1000 if v else None for q, v in itl_q.items()}
        lines.append(
            f"| {label} | "
            + " | ".join(sb.fmt(sb.pct(tpot, q), 1) for q in (50, 90, 99))
            + " | "
            + " | ".join(sb.fmt(pooled[label]["engine_itl_ms"][q], 1) for q in (50, 90, 99))
            + " |"
        )
    lines.append("")
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
        for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            for q in ("p50", "p90", "p99"):
                va = [dig(sb.summary_of(p), metric, q) for p in bundles[a][:n]]
                vb = [dig(sb.summary_of(p), metric, q) for p in bundles[b][:n]]
                if any(v is None for v in va + vb):
                    continue
                d = paired_difference(va, vb).to_json()
                pairs[f"{metric} {q}"] = d
                rel = f"{d['relative'] * 100:+.1f}%" if d["relative"] is not None else "-"
                lines.append(
                    f"| {metric.split('_')[0].upper()} {q} ms | {d['mean_a']:.1f} | "
                    f"{d['mean_b']:.1f} | {d['mean_diff']:+.1f} | [{d['ci_low']:.1f}, "
                    f"{d['ci_high']:.1f}] | {rel} | {d['verdict']} |"
                )
    lines += [
        "",
        "| run | start UTC | load 1-min before / after | sim lag % (worst) | TTFT p50 | TTFT p90 "
        "| TTFT p99 | TPOT p90 | ITL p99 | engine ITL p99 (engine ms) | engine ITL > 50 ms % "
        "| P/D decisions |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, paths in bundles.items():
        for k, p in enumerate(paths):
            m = orjson.loads((p / "machine.json").read_bytes())
            lags = [x for x in m["sim_lag_fraction"] if x is not None]
            pd = ", ".join(
                f"{key.split('{')[1].rstrip('}')} {v:.0f}"
                for key, v in m["proxy_pd"].items()
                if key.startswith("fleet_pd_decisions_total") and v
            )
            run = sb.summary_of(p)
            hist = engine_itl_buckets(p)
            engine_itl = histogram_quantile(0.99, hist)
            slow = share_above(0.05, hist)
            figures = [
                dig(run, "ttft_ms", "p50"),
                dig(run, "ttft_ms", "p90"),
                dig(run, "ttft_ms", "p99"),
                dig(run, "tpot_ms", "p90"),
                dig(run, "itl_ms", "p99"),
                engine_itl * 1000 if engine_itl is not None else None,
            ]
            slow_pct = sb.fmt(slow * 100 if slow is not None else None, 2)
            lines.append(
                f"| {label} {k} | {m['started_utc']} | {m['load_before'][0]:.1f} / "
                f"{m['load_after'][0]:.1f} | {sb.fmt(max(lags) * 100 if lags else None)} | "
                + " | ".join(sb.fmt(v, 0) for v in figures)
                + f" | {slow_pct} | {pd or '-'} |"
            )
    return "\n".join(lines), {"pooled": pooled, "paired": pairs}


def main(argv: list[str]) -> int:
    argv, bench_args = cp.split_bench_args(argv, shlex.split(DEFAULT_BENCH_LINE))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--speed", type=float, default=0.25, help="simulator clock speed")
    p.add_argument("--profile", default="h100-llama-8b")
    p.add_argument("--model", default="sim-llama-8b")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("runs") / time.strftime("pd-%H%M%S"))
    p.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        help="run nothing: rebuild the tables from these earlier --out directories (same "
        "command), pairing their runs in order",
    )
    args = p.parse_args(argv)
    out: Path = args.out
    if args.pool:
        done = {
            s: [
                b
                for d in args.pool
                for b in sorted(
                    (d / "runs").glob(f"{s}-*"), key=lambda x: int(x.name.rsplit("-", 1)[1])
                )
                if (b / "machine.json").exists()
            ]
            for s in SETTINGS
        }
        print(tables(done, args.speed)[0])
        return 0
    (out / "logs").mkdir(parents=True, exist_ok=True)
    bundles = sb.run_alternating(
        SETTINGS, args.repeat, lambda setting, k: run_setting(setting, k, args, bench_args, out)
    )
    table, data = tables(bundles, args.speed)
    command = " ".join(["scripts/bench_pd.py", *argv, "--", *bench_args])
    text = (
        f"# P/D disaggregation vs aggregated ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"
        f"\n\n`{command}`\n\nspeed {args.speed}, profile {args.profile}\n\n{table}\n"
    )
    sb.write_report(out, "pd", text, data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
