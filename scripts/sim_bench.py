"""What the simulated-fleet benchmarks share: start `fleet-proxy sim` processes, run
`fleet-proxy bench` into a bundle, and record the machine's state around a run."""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.artifacts import write_json
from bench.cli import main as bench_main

cp = importlib.import_module("compare_peers")  # scripts/ is on sys.path (the caller's)


def start_sims(
    args: Any,
    logs: Path,
    tag: str,
    roles: list[str],
    *,
    engines: int = 2,
    extra: Sequence[str] = (),
) -> tuple[list[Any], list[Any]]:
    """One `fleet-proxy sim` process of `engines` engines per entry of `roles` (its engines'
    role), at `args.speed`, `args.profile`, `args.model`, with `extra` flags of
    `fleet-proxy sim`: (procs, [(url, role)])."""
    procs, backends = [], []
    for i, role in enumerate(roles):
        cmd = [
            sys.executable, "-c", cp.SIM_MAIN, "--engines", str(engines), "--base-port", "0",
            "--speed", str(args.speed), "--profile", args.profile, "--model", args.model,
            "--role", role, *extra,
        ]  # fmt: skip
        proc = cp.Proc(cmd, logs / f"{tag}-sim{i}.log")
        procs.append(proc)

        def urls(proc: Any = proc) -> list[str]:
            lines = proc.log.read_text().splitlines()
            return [x.strip() for x in lines if x.startswith("http://")]

        cp.wait_until(lambda urls=urls: len(urls()) >= engines, proc, 60, "simulated fleet")
        backends += [(u, role) for u in urls()[:engines]]
    return procs, backends


def start_proxy(config_file: Path, log: Path) -> tuple[Any, int]:
    """`fleet-proxy serve --config`, ready: (proc, port)."""
    port = cp.free_port()
    proxy = cp.Proc(
        [
            sys.executable, "-c", cp.PROXY_MAIN, "serve", "--port", str(port),
            "--config", str(config_file), "--log-level", "warning",
        ],
        log,
    )  # fmt: skip
    cp.wait_until(lambda: cp.answers(f"http://127.0.0.1:{port}/ready"), proxy, 60, "proxy")
    return proxy, port


def run_bench(bundle: Path, bench_args: list[str], what: str) -> None:
    """`fleet-proxy bench` with its output in `bundle/bench.out`; raises when it fails."""
    with (bundle / "bench.out").open("w") as f:
        saved, sys.stdout = sys.stdout, f
        try:
            code = bench_main(bench_args)
        finally:
            sys.stdout = saved
    if code != 0:
        raise RuntimeError(f"bench exited {code} for {what}")


def write_machine(
    bundle: Path, started: float, load_before: tuple[float, ...], urls: list[str], **extra: Any
) -> None:
    """`machine.json`: when the run started, the load around it, how far the simulated
    engines lagged their clock, and `extra`."""
    write_json(
        bundle / "machine.json",
        {
            "started_utc": time.strftime("%H:%M:%S", time.gmtime(started)),
            "load_before": list(load_before),
            "load_after": list(os.getloadavg()),
            "sim_lag_fraction": [cp.sim_lag(u) for u in urls],
            **extra,
        },
    )


def summary_of(bundle: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((bundle / "summary.json").read_bytes())["runs"][0]
    return data


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def run_alternating(
    settings: tuple[str, ...], repeat: int, run: Callable[[str, int], Path]
) -> dict[str, list[Path]]:
    """`run(setting, k)` for k in range(repeat), settings alternated (A B A B), so drift in
    the machine's load falls on both alike; Ctrl-C keeps what ran."""
    bundles: dict[str, list[Path]] = {s: [] for s in settings}
    try:
        for k in range(repeat):
            for s in settings:
                print(f"== {s} run {k}  load {os.getloadavg()[0]:.1f}", flush=True)
                bundles[s].append(run(s, k))
    except KeyboardInterrupt:
        print("interrupted: tabulating what ran", file=sys.stderr)
    return bundles


def write_report(out: Path, name: str, text: str, data: dict[str, Any]) -> None:
    """`name.md` and `name.json` under `out`, and the text on stdout."""
    (out / f"{name}.md").write_text(text)
    write_json(out / f"{name}.json", data)
    print(text)
    print(f"artifacts: {out}")
