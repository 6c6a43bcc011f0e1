"""Measure fleet-proxy's own overhead on loopback, optionally beside the Rust vllm-router.

Starts two fast fake vLLM backends (scripts/perf/fast_fake_vllm.py), fleet-proxy in front of
them (--policy, round_robin by default; --config adds a settings YAML such as a routing:
section), and with --vllm-router the PyPI `vllm-router` (round_robin) in front of the same two;
then drives each target with wrk (--wrk-threads, 1 by default) non-streaming (16 tokens) and
streaming (64 SSE events) at each concurrency, and at concurrency 1 for the latency
fleet-proxy adds.
Everything runs on this machine, so compare figures within one run only.

    python scripts/perf/bench_proxy_overhead.py [--vllm-router] [--duration 8] [--workers N]

With --workers N fleet-proxy runs as N worker processes (`fleet-proxy serve --workers N`);
its CPU per request is then the supervisor's and all its workers' together, and each run
also prints how the requests split between the workers (from /admin/workers).

--request-log and --max-concurrent-requests N measure those features switched on.

Needs `wrk` (Debian package) on PATH. Writes runs/perf-<time>/results.json and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TICKS = os.sysconf("SC_CLK_TCK")

LUA = """
wrk.method = "POST"
wrk.body = '{"model":"fake-model","prompt":"%s","max_tokens":16%s}'
wrk.headers["Content-Type"] = "application/json"
"""
SENTENCE = "Say something about routers."


def prompt_of(chars: int | None) -> str:
    """The prompt every request sends: the sentence, or it repeated to `chars` characters
    (a prefix-aware policy hashes one block per 64 of them)."""
    if chars is None:
        return SENTENCE
    return (f"{SENTENCE} " * (chars // len(SENTENCE) + 1))[:chars]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout:.0f}s")


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """pid's children, their children, and so on (from every process's parent in /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                children.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cpu_seconds(pid: int) -> float:
    """CPU time of pid and every live process below it (a supervisor and its workers)."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            fields = _stat(p)
            total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def worker_dispatched(base: str) -> list[int]:
    """Requests each fleet-proxy worker has dispatched so far."""
    with urllib.request.urlopen(base + "/admin/workers", timeout=5) as r:
        return [int(row["dispatched"]) for row in json.load(r)["rows"]]


def vllm_router_command(exe: str, port: int, backends: list[str]) -> list[str]:
    """vllm-router on `port` over `backends`, round robin (its cheapest policy), quiet, with
    its metrics on a port of their own."""
    cmd = [exe, "--port", str(port), "--policy", "round_robin", "--worker-urls", *backends]
    return [*cmd, "--log-level", "warning", "--prometheus-port", str(free_port())]


def pinned(cmd: list[str], cpus: str | None) -> list[str]:
    """`cmd` run on the given CPUs (taskset's list syntax, e.g. "0" or "2-7"), or as is."""
    return cmd if cpus is None else ["taskset", "-c", cpus, *cmd]


def proxy_durations(base: str) -> dict[float, float]:
    """fleet-proxy's own request-duration histogram, summed over labels: bucket bound -> count."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        text = r.read().decode()
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "fleet_proxy_request_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return buckets


def proxy_p99_bound_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The upper bound of the histogram bucket holding the 99th percentile of the requests
    the proxy itself timed between two reads (from the ASGI call to the last byte written):
    compared with the client's p99, it tells time spent in the proxy's handling from time
    spent elsewhere (the accept queue, socket buffers, the client)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    target = 0.99 * counts[-1]
    return next(1000 * b for b, c in zip(bounds, counts, strict=True) if c >= target)


@contextlib.contextmanager
def process(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wrk(
    url: str,
    concurrency: int,
    duration: float,
    stream: bool,
    lua_dir: Path,
    headers: dict[str, str] | None = None,
    threads: int = 1,
    cpus: str | None = None,
    prompt: str = SENTENCE,
) -> dict[str, float]:
    script = lua_dir / ("stream.lua" if stream else "plain.lua")
    if not script.exists():
        lua = LUA % (prompt, ',"stream":true' if stream else "")
        for name, value in (headers or {}).items():
            lua += f'wrk.headers["{name}"] = "{value}"\n'
        script.write_text(lua)
    out = subprocess.run(
        pinned(
            [
                "wrk",
                f"-t{min(threads, concurrency)}",
                f"-c{concurrency}",
                f"-d{max(1, round(duration))}s",
                "--latency",
                "-s",
                str(script),
                url,
            ],
            cpus,
        ),
        capture_output=True,
        text=True,
        timeout=duration + 60,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    lat = {m.group(1): _ms(m.group(2)) for m in re.finditer(r"\s+(50|99)%\s+([\d.]+\w+)", out)}
    return {
        "rps": rps,
        "requests": total,
        "non2xx": int(errors.group(1)) if errors else 0,
        "p50_ms": lat.get("50", float("nan")),
        "p99_ms": lat.get("99", float("nan")),
    }


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def vllm_router_executable(python: str) -> str | None:
    """PyPI vllm-router's executable: on PATH, else beside this Python (an unactivated venv)."""
    beside = Path(python).parent / "vllm-router"
    return shutil.which("vllm-router") or (str(beside) if beside.is_file() else None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=8.0, help="seconds per wrk run")
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    p.add_argument("--vllm-router", action="store_true", help="also measure PyPI vllm-router")
    p.add_argument("--workers", type=int, default=1, help="fleet-proxy worker processes")
    p.add_argument(
        "--policy",
        default="round_robin",
        help="fleet-proxy's --policy (vllm-router always runs round_robin)",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="a fleet-proxy settings YAML (e.g. a routing: section) passed as --config",
    )
    p.add_argument("--wrk-threads", type=int, default=1, help="wrk's -t (client threads)")
    p.add_argument(
        "--prompt-chars",
        type=int,
        help="send a prompt of this many characters (default: one 28-character sentence, "
        "shorter than one prefix block)",
    )
    p.add_argument(
        "--proxy-cpus",
        help="run the router under test (fleet-proxy, and vllm-router) on these CPUs (taskset)",
    )
    p.add_argument(
        "--client-cpus",
        help="run wrk and the fake backends on these CPUs (taskset), apart from the router",
    )
    p.add_argument(
        "--worker-listen",
        choices=["shared", "reuseport"],
        default=None,
        help="with --workers > 1: one shared listening socket or SO_REUSEPORT sockets",
    )
    p.add_argument(
        "--api-key",
        help="start fleet-proxy with this client key (api_keys) and send it on every request",
    )
    p.add_argument(
        "--cors-origin",
        help="start fleet-proxy with CORS for this origin and send it as Origin on every request",
    )
    p.add_argument(
        "--request-log",
        action="store_true",
        help="start fleet-proxy with request_log json, written to the results folder",
    )
    p.add_argument(
        "--max-concurrent-requests",
        type=int,
        help="start fleet-proxy with admission control at this many requests",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    headers: dict[str, str] = {}
    if args.api_key:
        os.environ["FLEET_PROXY_API_KEYS"] = args.api_key
        headers["Authorization"] = f"Bearer {args.api_key}"
    if args.cors_origin:
        os.environ["FLEET_PROXY_CORS_ALLOW_ORIGINS"] = args.cors_origin
        headers["Origin"] = args.cors_origin
    router = vllm_router_executable(sys.executable) if args.vllm_router else None
    if args.vllm_router and router is None:
        print(
            "bench_proxy_overhead.py: --vllm-router needs the vllm-router executable, not found "
            "on PATH nor beside this Python: pip install vllm-router, or leave --vllm-router out",
            file=sys.stderr,
        )
        return 2
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    out_dir = args.out or ROOT / "runs" / time.strftime("perf-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.request_log:
        os.environ["FLEET_PROXY_REQUEST_LOG"] = "json"
        os.environ["FLEET_PROXY_REQUEST_LOG_FILE"] = str(out_dir / "requests.jsonl")
    if args.max_concurrent_requests:
        os.environ["FLEET_PROXY_MAX_CONCURRENT_REQUESTS"] = str(args.max_concurrent_requests)
    lua_dir = Path(tempfile.mkdtemp())
    prompt = prompt_of(args.prompt_chars)
    py = sys.executable
    ports = [free_port(), free_port()]
    backends = [f"http://127.0.0.1:{p}" for p in ports]
    proxy_port = free_port()
    results: dict[str, object] = {
        "duration_s": args.duration,
        "workers": args.workers,
        "policy": args.policy,
        "config": str(args.config) if args.config else None,
        "wrk_threads": args.wrk_threads,
        "prompt_chars": len(prompt_of(args.prompt_chars)),
        "proxy_cpus": args.proxy_cpus,
        "client_cpus": args.client_cpus,
        "worker_listen": args.worker_listen,
        "load_average_before": os.getloadavg()[0],
        "runs": [],
    }
    runs: list[dict[str, object]] = results["runs"]  # type: ignore[assignment]

    with contextlib.ExitStack() as stack:
        for port in ports:
            stack.enter_context(
                process(
                    pinned(
                        [py, str(HERE / "fast_fake_vllm.py"), "--port", str(port)], args.client_cpus
                    ),
                    out_dir / f"backend-{port}.log",
                )
            )
        for b in backends:
            wait_http(b + "/health")
        fleet_cmd = [
            py,
            "-m",
            "proxy.serving.cli",
            "serve",
            "--port",
            str(proxy_port),
            "--policy",
            args.policy,
            "--log-level",
            "warning",
        ]
        if args.config:
            fleet_cmd += ["--config", str(args.config)]
        for b in backends:
            fleet_cmd += ["--backend", b]
        if args.workers > 1:
            fleet_cmd += ["--workers", str(args.workers)]
        if args.worker_listen:
            os.environ["FLEET_PROXY_WORKER_LISTEN"] = args.worker_listen
        proxy = stack.enter_context(
            process(pinned(fleet_cmd, args.proxy_cpus), out_dir / "fleet-proxy.log")
        )
        wait_http(f"http://127.0.0.1:{proxy_port}/ready")
        targets: list[tuple[str, str, int | None]] = [
            ("direct", backends[0], None),
            ("fleet-proxy", f"http://127.0.0.1:{proxy_port}", proxy.pid),
        ]
        if args.vllm_router:
            assert router is not None  # checked before anything started
            exe = router
            vr_port = free_port()
            vr = stack.enter_context(
                process(
                    pinned(vllm_router_command(exe, vr_port, backends), args.proxy_cpus),
                    out_dir / "vllm-router.log",
                )
            )
            wait_http(f"http://127.0.0.1:{vr_port}/health", timeout=60)
            targets.append(("vllm-router", f"http://127.0.0.1:{vr_port}", vr.pid))

        for stream in (False, True):
            for c in args.concurrency:
                for name, base, pid in targets:
                    split = name == "fleet-proxy" and args.workers > 1
                    dispatched = worker_dispatched(base) if split else []
                    before = cpu_seconds(pid) if pid else 0.0
                    # One worker's /metrics is the whole proxy's only with one worker.
                    timed = name == "fleet-proxy" and args.workers == 1
                    durations = proxy_durations(base) if timed else {}
                    r = wrk(
                        base + "/v1/completions",
                        c,
                        args.duration,
                        stream,
                        lua_dir,
                        headers,
                        args.wrk_threads,
                        args.client_cpus,
                        prompt,
                    )
                    cpu = (cpu_seconds(pid) - before) if pid else 0.0
                    row: dict[str, object] = {
                        "target": name,
                        "stream": stream,
                        "concurrency": c,
                        **r,
                        "cpu_us_per_req": 1e6 * cpu / r["requests"] if pid else None,
                    }
                    if timed:
                        row["proxy_p99_le_ms"] = proxy_p99_bound_ms(
                            durations, proxy_durations(base)
                        )
                    if split:
                        now = worker_dispatched(base)
                        row["worker_split"] = [a - b for a, b in zip(now, dispatched, strict=True)]
                    runs.append(row)
                    print(_line(row), flush=True)
        for name, base, _pid in targets[:2]:
            r = wrk(
                base + "/v1/completions",
                1,
                args.duration / 2,
                False,
                lua_dir,
                headers,
                1,
                args.client_cpus,
                prompt,
            )
            row = {"target": name, "stream": False, "concurrency": 1, **r, "cpu_us_per_req": None}
            runs.append(row)
            print(_line(row), flush=True)

    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out_dir / 'results.json'}")
    _summary(runs)
    return 0


def _line(row: dict[str, object]) -> str:
    cpu = row["cpu_us_per_req"]
    return (
        f"{row['target']:>12} {'stream' if row['stream'] else 'plain ':>6} "
        f"c={row['concurrency']:<4}"
        f" {row['rps']:>9.0f} req/s  p50 {row['p50_ms']:>7.2f} ms  p99 {row['p99_ms']:>7.2f} ms"
        f"  non2xx {row['non2xx']}"
        + (f"  cpu {cpu:.0f} us/req" if cpu else "")
        + (f"  proxy p99 <= {row['proxy_p99_le_ms']:.0f} ms" if row.get("proxy_p99_le_ms") else "")
        + (f"  workers {row['worker_split']}" if row.get("worker_split") else "")
    )


def _summary(runs: list[dict[str, object]]) -> None:
    def get(target: str, stream: bool, c: int) -> dict[str, object] | None:
        for r in runs:
            if (r["target"], r["stream"], r["concurrency"]) == (target, stream, c):
                return r
        return None

    for stream in (False, True):
        for c in sorted({int(r["concurrency"]) for r in runs if int(r["concurrency"]) > 1}):  # type: ignore[call-overload]
            fp, vr = get("fleet-proxy", stream, c), get("vllm-router", stream, c)
            if fp and vr:
                ratio = float(fp["rps"]) / float(vr["rps"])  # type: ignore[arg-type]
                print(
                    f"{'stream' if stream else 'plain'} c={c}: "
                    f"fleet-proxy / vllm-router = {ratio:.2f}x"
                )
    d, f = get("direct", False, 1), get("fleet-proxy", False, 1)
    if d and f:
        added = float(f["p50_ms"]) - float(d["p50_ms"])  # type: ignore[arg-type]
        print(f"added p50 latency at concurrency 1: {added:.3f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
