#!/usr/bin/env python
"""Benchmark: the load-based planner against static provisioning, on a time-scaled day of
traffic replayed open loop against simulated H100 engines with a small KV cache.

    .venv/bin/python scripts/bench_planner.py [--quick] [--duration 150] [--seed 0]
        [--out DIR] [--plot PNG]

The trace (Mooncake JSONL, fixed seed): Poisson arrivals whose rate follows a day (night at
`--low-rate`, a morning ramp, a plateau at `--peak-rate`, an evening fall, night again) over
`--duration` seconds; each request has a unique 1,000-2,000-token prompt and 100-200 output
tokens. `fleet-proxy bench` replays it at its timestamps (open loop), the same trace in each
of three runs, each with a fresh proxy (`lmetric`) and fresh engines (role `both`):

- `static-peak`: `--peak-engines` engines, enough for the plateau;
- `static-mean`: the engines the mean rate needs, peak engines x mean rate / peak rate;
- `planner`: one engine and `fleet-proxy plan` (aggregated, `LocalConnector` starting
  `fleet-proxy sim` workers of the same profile, at most `--peak-engines`), its intervals
  scaled with the trace's length.

Per run: TTFT, TPOT and both-SLO attainment over every request, failed requests (an error or
a stream without [DONE]) and cut ones (completion tokens other than the trace's output
length), and engine-seconds over the trace's span (static: engines x duration; planner: the
engines alive, the unmanaged one plus the planner's workers from its state file, sampled
every 0.25 s and integrated). Writes `planner.md`, `planner.json`, every run's bench bundle
and logs under `--out`, and a timeline plot (engines, requests in flight and arrival rate,
rolling attainment) to `--plot` (default: `planner_timeline.png` under `--out`; the docs'
plot is `--plot docs/img/planner_timeline.png`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import os
import random
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench.artifacts import read_records, write_json  # noqa: E402
from bench.records import RequestRecord  # noqa: E402
from bench.summary import meets_slo  # noqa: E402
from planner.local import LocalSettings, terminate  # noqa: E402

cp = importlib.import_module("compare_peers")  # scripts/ is on sys.path, above
sb = importlib.import_module("sim_bench")

SETTINGS = ("static-peak", "static-mean", "planner")
SAMPLE_S = 0.25


@dataclass(frozen=True, slots=True)
class Day:
    """Arrival rate over a day squeezed into `duration` seconds: night, a linear morning ramp,
    the peak plateau, a linear evening fall, night (fractions of the duration)."""

    duration: float
    low: float
    peak: float
    phases: tuple[float, float, float, float] = (0.2, 0.2, 0.25, 0.2)  # night, ramp, peak, fall

    def rate(self, t: float) -> float:
        night, ramp, peak, fall = (p * self.duration for p in self.phases)
        if t < night:
            return self.low
        if t < night + ramp:
            return self.low + (self.peak - self.low) * (t - night) / ramp
        if t < night + ramp + peak:
            return self.peak
        if t < night + ramp + peak + fall:
            return self.peak - (self.peak - self.low) * (t - night - ramp - peak) / fall
        return self.low

    def mean_rate(self, steps: int = 10_000) -> float:
        return sum(self.rate((i + 0.5) * self.duration / steps) for i in range(steps)) / steps


def day_trace(day: Day, seed: int) -> list[dict[str, Any]]:
    """Mooncake trace lines: a Poisson process of rate `day.rate(t)` (by thinning), each
    request with its own prompt blocks (no shared prefix), 1,000-2,000 prompt tokens and
    100-200 output tokens."""
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = []
    t, next_block = 0.0, 0
    while True:
        t += rng.expovariate(day.peak)
        if t >= day.duration:
            return lines
        if rng.random() * day.peak > day.rate(t):
            continue
        isl = rng.randint(1000, 2000)
        blocks = math.ceil(isl / 512)
        lines.append(
            {
                "timestamp": round(t * 1000),
                "input_length": isl,
                "output_length": rng.randint(100, 200),
                "hash_ids": list(range(next_block, next_block + blocks)),
            }
        )
        next_block += blocks


@dataclass(slots=True)
class Sample:
    at: float  # wall clock (time.time())
    engines: int  # engines alive: started by the run, plus the planner's workers
    backends: int  # registered with the proxy, not draining
    in_flight: int  # the proxy's requests in flight over all backends
    dispatched: int  # the proxy's requests dispatched so far


@dataclass(slots=True)
class Sampler:
    """Polls the proxy's backend list and the planner's state file every `SAMPLE_S`."""

    proxy: str
    static_engines: int
    state_file: Path | None = None
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def managed(self) -> int:
        if self.state_file is None or not self.state_file.exists():
            return 0
        try:
            return len(json.loads(self.state_file.read_text()).get("workers", []))
        except (OSError, ValueError):  # rewritten at this moment: the next poll reads it
            return self.samples[-1].engines - self.static_engines if self.samples else 0

    def poll(self) -> None:
        try:
            with urllib.request.urlopen(f"{self.proxy}/admin/backends", timeout=2) as resp:
                backends = json.loads(resp.read())
        except OSError:
            return
        live = [b for b in backends if not b.get("draining")]
        self.samples.append(
            Sample(
                at=time.time(),
                engines=self.static_engines + self.managed(),
                backends=len(live),
                in_flight=sum(int((b.get("load") or {}).get("in_flight", 0)) for b in backends),
                dispatched=sum(
                    int((b.get("load") or {}).get("dispatched_total", 0)) for b in backends
                ),
            )
        )

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.poll()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def timeline(self) -> list[dict[str, float]]:
        """Samples on the trace's clock: 0 at the first dispatched request (the trace's first
        arrival is at 0), within one sampling period."""
        first = next((s.at for s in self.samples if s.dispatched > 0), None)
        if first is None:
            return []
        t0 = first - SAMPLE_S / 2
        return [
            {"t": s.at - t0, "engines": s.engines, "backends": s.backends, "in_flight": s.in_flight}
            for s in self.samples
        ]


def engine_seconds(timeline: list[dict[str, float]], until: float) -> float:
    """The integral of engines alive over [0, until], each sample holding until the next."""
    total = 0.0
    for a, b in zip(timeline, [*timeline[1:], {"t": until}], strict=True):
        lo, hi = max(0.0, a["t"]), min(until, b["t"])
        if hi > lo:
            total += a["engines"] * (hi - lo)
    return total


def stop_workers(state_file: Path) -> None:
    """End the planner's workers (they outlive the planner on purpose), by their PIDs: SIGTERM,
    then SIGKILL after 5 s, as the planner itself stops a worker it did not start."""
    if not state_file.exists():
        return
    pids = [int(w["pid"]) for w in json.loads(state_file.read_text()).get("workers", [])]
    settings = LocalSettings(stop_grace_s=5.0)

    async def stop_all() -> None:
        await asyncio.gather(*(terminate(pid, None, settings) for pid in pids))

    asyncio.run(stop_all())


def planner_command(args: argparse.Namespace, proxy: str, out: Path, tag: str) -> list[str]:
    scale = args.duration / 150.0
    worker = (
        f"{sys.executable} -c '{cp.SIM_MAIN}' --engines 1 --base-port {{port}} --role {{role}} "
        f"--speed {args.speed} --profile {args.profile} --model {args.model} "
        f"--num-gpu-blocks {args.kv_blocks}"
    )
    return [
        sys.executable, "-c", cp.PROXY_MAIN, "plan", "--proxy", proxy, "--topology",
        "aggregated", "--metric-pulling-interval", "0.5",
        "--adjustment-interval", f"{max(1.5, 4.0 * scale):.2f}",
        "--decode-kv-scale-up-threshold", str(args.kv_up),
        "--decode-kv-scale-down-threshold", str(args.kv_down),
        "--new-decode-worker-grace-period", "2", "--min-decode-replicas", "1",
        "--max-decode-replicas", str(args.peak_engines), "--max-gpu-budget",
        str(args.peak_engines), "--decode-command", worker,
        "--state-file", str(out / "logs" / f"{tag}-planner-state.json"),
        "--log-dir", str(out / "logs" / f"{tag}-workers"), "--drain-deadline", "60",
        "--start-timeout", "60",
    ]  # fmt: skip


def run_setting(
    setting: str, args: argparse.Namespace, trace: Path, engines: int, out: Path
) -> dict[str, Any]:
    logs, bundle = out / "logs", out / "runs" / setting
    bundle.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.time()
    # One engine per process, as the planner's workers run.
    sims, backends = sb.start_sims(
        args, logs, setting, ["both"] * engines, engines=1,
        extra=["--num-gpu-blocks", str(args.kv_blocks)],
    )  # fmt: skip
    proxy = planner = None
    state_file = logs / f"{setting}-planner-state.json"
    try:
        config = {"backends": [u for u, _ in backends], "routing": {"policy": "lmetric"}}
        config_file = bundle / "proxy.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        proxy, port = sb.start_proxy(config_file, logs / f"{setting}-proxy.log")
        url = f"http://127.0.0.1:{port}"
        sampler = Sampler(url, engines, state_file if setting == "planner" else None)
        if setting == "planner":
            planner = cp.Proc(
                planner_command(args, url, out, setting), logs / f"{setting}-planner.log"
            )
        sampler.start()
        try:
            sb.run_bench(
                bundle,
                [
                    "--target", f"{setting}={url}", "--model", args.model, "--api",
                    "completions", "--workload", "mooncake", "--trace", str(trace),
                    "--arrival", "trace", "--timeout", "180", "--out", str(bundle),
                    "--no-progress", "--slo", f"ttft:{args.ttft_slo}", f"tpot:{args.tpot_slo}",
                ],
                setting,
            )  # fmt: skip
        finally:
            sampler.stop()
        sb.write_machine(
            bundle, started, load_before, [u for u, _ in backends], engines_at_start=engines
        )
    finally:
        if planner is not None:
            planner.stop()
        stop_workers(state_file)
        if proxy is not None:
            proxy.stop()
        for s in sims:
            s.stop()
    return {"timeline": sampler.timeline(), "bundle": str(bundle), "engines": engines}


def request_outcomes(
    records: list[RequestRecord], trace_lines: list[dict[str, Any]], slo: dict[str, float]
) -> list[dict[str, Any]]:
    """Per request: arrival, failed, cut, and whether it met each SLO and both."""
    out = []
    for r in records:
        want = trace_lines[int(r.session_id.split("-")[1])]["output_length"]
        out.append(
            {
                "t": r.scheduled_s,
                "failed": not r.ok,
                "cut": r.ok and r.completion_tokens != want,
                "ttft": meets_slo(r, {"ttft": slo["ttft"]}),
                "tpot": meets_slo(r, {"tpot": slo["tpot"]}),
                "both": meets_slo(r, slo),
            }
        )
    return out


def summarize(
    setting: str, run: dict[str, Any], outcomes: list[dict[str, Any]], duration: float
) -> dict[str, Any]:
    n = len(outcomes)
    timeline = run["timeline"]

    def share(key: str) -> float | None:
        return sum(o[key] for o in outcomes) / n if n else None

    m = json.loads((Path(run["bundle"]) / "machine.json").read_text())
    lags = [x for x in m["sim_lag_fraction"] if x is not None]
    return {
        "setting": setting,
        "requests": n,
        "ttft_attainment": share("ttft"),
        "tpot_attainment": share("tpot"),
        "both_attainment": share("both"),
        "failed": sum(o["failed"] for o in outcomes),
        "cut": sum(o["cut"] for o in outcomes),
        "engine_seconds": (
            engine_seconds(timeline, duration)
            if setting == "planner"
            else run["engines"] * duration
        ),
        "engines_max": max((s["engines"] for s in timeline), default=None),
        "load_before": m["load_before"][0],
        "load_after": m["load_after"][0],
        "sim_lag_max": max(lags) if lags else None,
    }


def planner_actions(log: Path) -> dict[str, int]:
    """Scale-ups, scale-downs, drains and drain timeouts, from the planner's log."""
    text = log.read_text() if log.exists() else ""
    return {
        "scale_ups": text.count("scale_up_kv"),
        "scale_downs": text.count("scale_down_kv"),
        "drained": text.count("drained and stopped"),
        "drain_timeouts": text.count("of draining; left up"),
    }


def table(rows: list[dict[str, Any]], peak_es: float) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.1f}%"

    lines = [
        "| setting | requests | TTFT SLO met | TPOT SLO met | both met | failed | cut "
        "| engine-s | vs peak | max engines | load before / after | sim lag (worst) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lag = r["sim_lag_max"]
        lines.append(
            f"| {r['setting']} | {r['requests']} | {pct(r['ttft_attainment'])} | "
            f"{pct(r['tpot_attainment'])} | {pct(r['both_attainment'])} | {r['failed']} | "
            f"{r['cut']} | {r['engine_seconds']:.0f} | {pct(r['engine_seconds'] / peak_es)} | "
            f"{r['engines_max']} | {r['load_before']:.1f} / {r['load_after']:.1f} | "
            f"{'-' if lag is None else f'{lag * 100:.0f}%'} |"
        )
    return "\n".join(lines)


def rolling(
    outcomes: list[dict[str, Any]], window: float, until: float
) -> tuple[list[float], list[float]]:
    """Both-SLO attainment of the requests that arrived in the `window` before each time."""
    xs, ys = [], []
    t = window
    while t <= until:
        inside = [o["both"] for o in outcomes if t - window <= o["t"] < t]
        if inside:
            xs.append(t)
            ys.append(sum(inside) / len(inside))
        t += window / 4
    return xs, ys


def plot(
    path: Path,
    runs: dict[str, dict[str, Any]],
    outcomes: dict[str, list[dict[str, Any]]],
    trace_lines: list[dict[str, Any]],
    day: Day,
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"static-peak": "tab:blue", "static-mean": "tab:orange", "planner": "tab:green"}
    fig, (ax_e, ax_l, ax_s) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for setting, run in runs.items():
        tl = run["timeline"]
        xs = [s["t"] for s in tl if 0 <= s["t"] <= day.duration * 1.1]
        ax_e.step(xs, [s["engines"] for s in tl if 0 <= s["t"] <= day.duration * 1.1],
                  where="post", color=colors[setting], label=setting)  # fmt: skip
        ax_l.plot(xs, [s["in_flight"] for s in tl if 0 <= s["t"] <= day.duration * 1.1],
                  color=colors[setting], label=f"in flight, {setting}")  # fmt: skip
        rx, ry = rolling(outcomes[setting], max(5.0, day.duration / 15), day.duration)
        ax_s.plot(rx, [y * 100 for y in ry], color=colors[setting], label=setting)
    ax_e.set_ylabel("decode (aggregated) engines")
    ax_e.legend(loc="upper left")
    bin_s = max(2.0, day.duration / 50)
    bins = [0] * (int(day.duration / bin_s) + 1)
    for line in trace_lines:
        bins[int(line["timestamp"] / 1000 / bin_s)] += 1
    ax_r = ax_l.twinx()
    ax_r.plot([(i + 0.5) * bin_s for i in range(len(bins))], [b / bin_s for b in bins],
              color="grey", linestyle="--", label="arrival rate")  # fmt: skip
    ax_r.set_ylabel("arrivals / s (dashed)")
    ax_l.set_ylabel("requests in flight")
    ax_l.legend(loc="upper left", fontsize="small")
    ax_s.set_ylabel("both SLOs met, rolling %")
    ax_s.axhline(95, color="grey", linewidth=0.5)
    ax_s.set_xlabel("trace time (s)")
    ax_s.legend(loc="lower left")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def options(argv: list[str]) -> argparse.Namespace:
    """The command line; it ends the script at once when the plot cannot be drawn."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="a 40 s day: a smoke run")
    p.add_argument("--duration", type=float, help="seconds of the day (default 150, quick 40)")
    p.add_argument("--low-rate", type=float, default=0.3, help="night arrivals per second")
    p.add_argument("--peak-rate", type=float, default=3.2, help="peak arrivals per second")
    p.add_argument("--peak-engines", type=int, default=4, help="static provisioning at peak")
    p.add_argument("--kv-blocks", type=int, default=512, help="KV blocks of 16 tokens per engine")
    p.add_argument("--kv-up", type=float, default=0.6, help="planner KV scale-up threshold")
    p.add_argument("--kv-down", type=float, default=0.3, help="planner KV scale-down threshold")
    p.add_argument("--ttft-slo", type=float, default=2000.0, help="ms of wall time")
    p.add_argument("--tpot-slo", type=float, default=50.0, help="ms of wall time")
    p.add_argument("--speed", type=float, default=0.25, help="simulator clock speed")
    p.add_argument("--profile", default="h100-llama-8b")
    p.add_argument("--model", default="sim-llama-8b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--settings", default=",".join(SETTINGS), help="which runs, in order")
    p.add_argument("--out", type=Path, default=Path("runs") / time.strftime("planner-%H%M%S"))
    p.add_argument("--plot", type=Path, help="the timeline plot (default OUT/planner_timeline.png)")
    args = p.parse_args(argv)
    cp.require_module("matplotlib", "bench_planner.py", "the timeline plot", cp.MATPLOTLIB_INSTALL)
    if args.plot is None:  # only under --out: the plot in docs/img is replaced when asked for
        args.plot = args.out / "planner_timeline.png"
    if args.duration is None:
        args.duration = 40.0 if args.quick else 150.0
    return args


def main(argv: list[str]) -> int:
    args = options(argv)
    out: Path = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    day = Day(args.duration, args.low_rate, args.peak_rate)
    mean_engines = max(1, round(args.peak_engines * day.mean_rate() / args.peak_rate))
    engines = {"static-peak": args.peak_engines, "static-mean": mean_engines, "planner": 1}
    trace_lines = day_trace(day, args.seed)
    trace = out / "trace.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in trace_lines))
    slo = {"ttft": args.ttft_slo / 1000, "tpot": args.tpot_slo / 1000}
    print(
        f"{len(trace_lines)} requests over {args.duration:.0f} s (mean rate "
        f"{day.mean_rate():.2f}/s, peak {args.peak_rate}/s); engines {engines}",
        flush=True,
    )
    runs: dict[str, dict[str, Any]] = {}
    outcomes: dict[str, list[dict[str, Any]]] = {}
    rows = []
    for setting in args.settings.split(","):
        print(f"== {setting}  load {os.getloadavg()[0]:.1f}", flush=True)
        runs[setting] = run_setting(setting, args, trace, engines[setting], out)
        records = read_records(Path(runs[setting]["bundle"]) / "metrics.jsonl")
        outcomes[setting] = request_outcomes(records, trace_lines, slo)
        rows.append(summarize(setting, runs[setting], outcomes[setting], args.duration))
    peak_es = args.peak_engines * args.duration
    actions = planner_actions(out / "logs" / "planner-planner.log")
    command = " ".join(["scripts/bench_planner.py", *argv])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = "\n".join(
        [
            f"# The planner against static provisioning ({when})",
            "",
            f"`{command}`",
            "",
            f"{len(trace_lines)} requests over a {args.duration:.0f} s day (seed {args.seed}): "
            f"rate {args.low_rate}/s at night, {args.peak_rate}/s at peak, mean "
            f"{day.mean_rate():.2f}/s. Engines: {args.profile} at speed {args.speed}, "
            f"{args.kv_blocks} KV blocks of 16 tokens each. SLOs (wall time): TTFT "
            f"{args.ttft_slo:.0f} ms, TPOT {args.tpot_slo:.0f} ms. Engine-seconds over "
            f"[0, {args.duration:.0f} s]; 'vs peak' against {args.peak_engines} engines x "
            f"{args.duration:.0f} s.",
            "",
            table(rows, peak_es),
            "",
            "Planner actions: "
            + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in actions.items()),
            "",
        ]
    )
    data = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "engines": engines,
        "requests": len(trace_lines),
        "mean_rate": day.mean_rate(),
        "results": rows,
        "planner_actions": actions,
        "timelines": {s: r["timeline"] for s, r in runs.items()},
    }
    write_json(out / "planner_outcomes.json", outcomes)
    plot(args.plot, runs, outcomes, trace_lines, day, f"{command}  ({when})")
    sb.write_report(out, "planner", text, data)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
