"""CPU per request, and CPU while idle, of `fleet-proxy serve --workers N` for several N.

Starts `fleet-proxy sim` (--engines simulated engines, fast clock) and, for each N of
--workers, fleet-proxy with N worker processes in front of it; measures
- idle: the proxy's CPU per second with no request at all (--idle seconds), its background
  cost: scrapes, the workers' sync, timers;
- plain and stream: the proxy's CPU per request served under a bounded wrk load (--duration
  seconds at --concurrency, 16 tokens non-streamed, then streamed): as fast as it goes, or
  at about --rate requests per second over all connections (each connection waits
  concurrency / rate seconds between its requests), so no worker is saturated;
- marginal CPU per request: the same less the idle CPU per second over the run's seconds,
  what serving the requests added to the background work.
The proxy's CPU is the supervisor's and every worker's together (utime + stime from
/proc/PID/stat), so it can be measured even where the machine is too loaded for throughput
to mean much; the load average is printed beside every row.

--tree DIR (repeatable) runs the proxy from another source tree (e.g. a `git worktree` of an
older commit, with `python -P` and PYTHONPATH=DIR): the trees are run in turn, alternated for
every N and every --rounds, so before and after see the same machine.

    python scripts/perf/bench_workers_cpu.py [--workers 1 2 4] [--rounds 2] [--tree /tmp/old]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import bench_proxy_overhead as overhead  # noqa: E402  (free_port, wait_http, process, wrk, cpu)


def stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds: this process's own child, by PID."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def simulator(engines: int, speed: float, log: Path) -> Iterator[list[str]]:
    """`fleet-proxy sim` on free ports; yields the engines' URLs (it prints one a line)."""
    cmd = [sys.executable, "-m", "proxy.serving.cli", "sim", "--engines", str(engines)]
    cmd += ["--base-port", "0", "--speed", str(speed), "--model", "fake-model"]
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
        try:
            assert proc.stdout is not None
            urls = [proc.stdout.readline().decode().strip() for _ in range(engines)]
            if not all(u.startswith("http://") for u in urls):
                raise RuntimeError(f"the simulator did not start (see {log})")
            for url in urls:
                overhead.wait_http(url + "/health")
            yield urls
        finally:
            stop(proc, 10)


def proxy_command(tree: Path, port: int, workers: int, backends: list[str]) -> list[str]:
    cmd = [sys.executable, "-P", "-m", "proxy.serving.cli", "serve", "--port", str(port)]
    cmd += ["--policy", "round_robin", "--log-level", "warning", "--workers", str(workers)]
    for b in backends:
        cmd += ["--backend", b]
    return cmd


def wait_workers(base: str, workers: int, timeout: float = 60.0) -> None:
    """Until every worker has started (has a pid in its row)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(base + "/admin/workers") as r:
            rows = json.load(r)["rows"]
            if len(rows) == workers and all(row.get("pid") for row in rows):
                return
        time.sleep(0.2)
    raise RuntimeError(f"{workers} workers did not all start within {timeout:.0f}s")


def wrk(
    url: str, concurrency: int, duration: float, stream: bool, lua: Path, rate: float | None
) -> dict[str, float]:
    """wrk's figures, failures (non-2xx answers and socket errors, timeouts included) too."""
    script = lua / (("stream" if stream else "plain") + ("" if rate is None else f"-{rate:g}"))
    if not script.exists():
        text = overhead.LUA % (overhead.SENTENCE, ',"stream":true' if stream else "")
        if rate is not None:
            # wrk waits delay() ms before each request on a connection: the offered rate is
            # at most concurrency / delay, a little less by the requests' own latency.
            text += f"function delay() return {1000.0 * concurrency / rate:.3f} end\n"
        script.write_text(text)
    cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration))}s", "-s", str(script)]
    out = subprocess.run(
        [*cmd, url], capture_output=True, text=True, timeout=duration + 60, check=True
    ).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    if rps is None or total is None:
        raise RuntimeError(f"cannot read wrk's output: {out}")
    failed = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if errors:
        failed += sum(int(n) for n in errors.groups())
    return {"rps": float(rps.group(1)), "requests": int(total.group(1)), "failed": failed}


def measure(
    tree: Path,
    workers: int,
    backends: list[str],
    args: argparse.Namespace,
    out: Path,
    lua: Path,
) -> dict[str, object]:
    port = overhead.free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = proxy_command(tree, port, workers, backends)
    log = out / f"proxy-{tree.name}-{workers}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=tree)
        try:
            overhead.wait_http(base + "/ready", timeout=60)
            if workers > 1:
                wait_workers(base, workers)
            time.sleep(args.settle)  # start-up's own work (imports, first scrapes) is over
            row: dict[str, object] = {"tree": str(tree), "workers": workers}
            before = overhead.cpu_seconds(proc.pid)
            t0 = time.monotonic()
            time.sleep(args.idle)
            idle = overhead.cpu_seconds(proc.pid) - before
            row["idle_cpu_ms_per_s"] = 1000 * idle / (time.monotonic() - t0)
            idle_per_s = idle / (time.monotonic() - t0)
            for stream in (False, True):
                name = "stream" if stream else "plain"
                before = overhead.cpu_seconds(proc.pid)
                t1 = time.monotonic()
                r = wrk(
                    base + "/v1/completions",
                    args.concurrency,
                    args.duration,
                    stream,
                    lua,
                    args.rate,
                )
                cpu = overhead.cpu_seconds(proc.pid) - before
                background = idle_per_s * (time.monotonic() - t1)
                n = r["requests"]
                row[f"{name}_rps"] = r["rps"]
                row[f"{name}_failed"] = r["failed"]
                row[f"{name}_cpu_us_per_req"] = 1e6 * cpu / n if n else None
                row[f"{name}_marginal_us_per_req"] = 1e6 * (cpu - background) / n if n else None
            row["load_average"] = os.getloadavg()[0]
            return row
        finally:
            stop(proc, 30)


def line(row: dict[str, object]) -> str:
    def us(key: str) -> str:
        value = row.get(key)
        return f"{value:7.0f}" if isinstance(value, float) else "      -"

    return (
        f"{Path(str(row['tree'])).name:>14} workers={row['workers']}"
        f"  idle {row['idle_cpu_ms_per_s']:6.1f} ms CPU/s"
        f"  plain {us('plain_cpu_us_per_req')} us/req, marginal {us('plain_marginal_us_per_req')}"
        f" ({row['plain_rps']:6.0f} req/s)"
        f"  stream {us('stream_cpu_us_per_req')} us/req,"
        f" marginal {us('stream_marginal_us_per_req')} ({row['stream_rps']:6.0f} req/s)"
        f"  failed {row['plain_failed']}+{row['stream_failed']}  load {row['load_average']:.2f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--engines", type=int, default=4, help="simulated engines behind the proxy")
    p.add_argument("--speed", type=float, default=50.0, help="the simulator's clock speed")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="requests per second offered over all connections (default: as fast as it goes)",
    )
    p.add_argument("--duration", type=float, default=5.0, help="seconds of each wrk run")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of idle measured")
    p.add_argument("--settle", type=float, default=2.0, help="seconds waited after start-up")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--tree",
        type=Path,
        action="append",
        help="a source tree to run the proxy from (repeatable; default this one)",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    out = args.out or ROOT / "runs" / time.strftime("workers-cpu-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    lua = Path(tempfile.mkdtemp())
    rows: list[dict[str, object]] = []
    with simulator(args.engines, args.speed, out / "sim.log") as backends:
        for r in range(args.rounds):
            for workers in args.workers:
                # Alternate which tree goes first, so neither always meets a warmer machine.
                order = trees if r % 2 == 0 else trees[::-1]
                for tree in order:
                    row = measure(tree, workers, backends, args, out, lua)
                    row["round"] = r
                    rows.append(row)
                    print(line(row), flush=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
