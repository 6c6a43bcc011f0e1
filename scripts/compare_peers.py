#!/usr/bin/env python
"""Peer routers side by side: vllm-router, sglang-router and fleet-proxy's policies, each in
front of the same simulated fleet, replaying the same workload; one table and one plot.

    .venv/bin/python scripts/compare_peers.py [--engines 4] [--speed 2] [--repeat 1]
        [--settings vllm-router:round_robin,fleet-proxy:lmetric,...] [--out DIR]
        [--peers-venv DIR] [--ready-timeout 120]
        [-- BENCH ARGS]          (default: an agent workload, see DEFAULT_BENCH_ARGS)

A setting is ROUTER:POLICY. A fleet-proxy setting may add policy parameters `/KEY=VALUE`,
`+precise` and `@wN`, in that order: `fleet-proxy:unified/overload_factor=1.5` gives the proxy a
`--config` with `routing: {policy: unified, params: {overload_factor: 1.5}}` (values read as
YAML); `fleet-proxy:unified@w2` serves with `--workers 2`; `fleet-proxy:unified+precise` starts the
fleet with `--kv-events-config` (every engine binds its publisher and replay socket on free
loopback ports) and the proxy with a `--config` YAML naming each backend's endpoints and
`routing: {policy: POLICY, precise_prefix: {}}` (the policy, its uncached-token figure from the
engines' KV-cache events). After such a run the proxy's /metrics (every worker's) must show
events applied, blocks indexed, every backend's index trusted and prompts tokenized for it,
else the campaign stops with PreciseIndexUnused; what they showed is in the run's
precise.json.

Every run starts a fresh fleet (`fleet-proxy sim`, cold caches, same seed) and a fresh router
on free loopback ports, waits until the router has served a completion naming the engines'
model (read from an engine's /v1/models; 503s while a router registers its workers are
retried, for up to --ready-timeout), runs `fleet-proxy bench` against the router with that
model and the engines' /metrics snapshotted before and after, and stops both by PID. The
1-minute load average just before and after each replay is recorded (costs.json, the table),
with a warning whenever it exceeds the core count. With
--repeat N the settings alternate (A B C A B C ...) and each is compared with the first by a
paired 95% interval. Everything shares the machine's cores: the routers' own CPU cost is part
of what is measured, as it would be on a real host.

The PyPI routers are best kept in a venv of their own, so fleet-proxy's stays as it is:
`python3 -m venv ../peers-venv && ../peers-venv/bin/pip install vllm-router sglang-router`,
then `--peers-venv ../peers-venv`; without it they are looked for in this venv, then on PATH
(settings whose router is missing are skipped and listed). The table also gives the requests
each engine finished (from the engines' /metrics) and the busiest engine over the mean.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import importlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from machine_load import busy_summary, busy_warning, cores, load_now  # noqa: E402
from peer_readiness import bench_api, fleet_model, router_executable, wait_until_serving  # noqa: E402
from port_owner import group_listens_on  # noqa: E402
from request_spread import counts_text, spread  # noqa: E402

from bench.artifacts import comparison_table, read_records, settings_table, write_json  # noqa: E402
from bench.campaign import RunResult, pooled_summary  # noqa: E402
from bench.cli import main as bench_main  # noqa: E402
from bench.paired import compare_settings  # noqa: E402
from bench.summary import dig, parse_slo  # noqa: E402
from proxy.serving.parent_death import die_with_parent  # noqa: E402


def require_module(module: str, script: str, why: str, install: str) -> None:
    """Ends the script before it starts anything, with one line, when an optional module it
    will need at the end (matplotlib for the plots) cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise SystemExit(f"{script}: {why} needs {module}, not installed here: {install}") from None


MATPLOTLIB_INSTALL = "pip install -e '.[plots]'"
PEER_POLICIES = ("round_robin", "cache_aware", "power_of_two")
FLEET_PROXY_POLICIES = ("round_robin", "least_requests", "prefix_aware", "lmetric", "unified")
DEFAULT_SETTINGS = (
    *(f"vllm-router:{p}" for p in PEER_POLICIES),
    *(f"sglang-router:{p}" for p in PEER_POLICIES),
    *(f"fleet-proxy:{p}" for p in FLEET_PROXY_POLICIES),
)
# Agent programs: a long per-program context reused by every call, so where a call lands
# decides whether its prefix is cached; closed loop so the fleet stays busy.
# --timeout: a stalled router costs a minute per request, not the bench's default five.
DEFAULT_BENCH_LINE = (
    "--workload agent --sessions 16 --calls 4-8 --context-tokens 3000 --user-tokens 64-256 "
    "--output-tokens 16-64 --concurrency 12 --slo ttft:1000 tpot:100 --timeout 60"
)
DEFAULT_BENCH_ARGS = tuple(shlex.split(DEFAULT_BENCH_LINE))
SIM_MAIN = "import sys; from simulator.cli import main; sys.exit(main(sys.argv[1:]))"
PROXY_MAIN = "import sys; from proxy.serving.cli import main; sys.exit(main(sys.argv[1:]))"


@dataclass(frozen=True, slots=True)
class RouterSetting:
    kind: str  # vllm-router | sglang-router | fleet-proxy
    policy: str
    workers: int = 1  # fleet-proxy serve --workers
    precise: bool = False  # the engines publish KV-cache events; routing uses them
    # fleet-proxy's policy parameters (routing: {policy, params}), as given after the policy.
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        params = "".join(f"/{k}={_param_text(v)}" for k, v in self.params)
        precise = "+precise" if self.precise else ""
        workers = f"@w{self.workers}" if self.workers != 1 else ""
        return f"{self.kind}:{self.policy}{params}{precise}{workers}"

    @property
    def file_tag(self) -> str:
        """The label as a file name: no ':' or '/'."""
        return self.label.replace(":", "-").replace("/", "_")

    @classmethod
    def parse(cls, text: str) -> RouterSetting:
        """ROUTER:POLICY, and for fleet-proxy optionally /KEY=VALUE policy parameters, then
        +precise, then @wN."""
        kind, sep, rest = text.partition(":")
        if not sep or kind not in ("vllm-router", "sglang-router", "fleet-proxy"):
            raise ValueError(f"bad setting {text!r}: want ROUTER:POLICY[/K=V...][+precise][@wN]")
        rest, at, workers_text = rest.partition("@")
        workers = 1
        if at:
            digits = workers_text.removeprefix("w")
            if not workers_text.startswith("w") or not (digits.isascii() and digits.isdigit()):
                raise ValueError(f"bad setting {text!r}: want @wN (N worker processes) at the end")
            workers = int(digits)
            if workers < 1:
                raise ValueError(f"bad setting {text!r}: @wN needs N >= 1")
        rest, plus, flag = rest.partition("+")
        if plus and flag != "precise":
            raise ValueError(f"bad setting {text!r}: the only +FLAG is +precise")
        policy, *pairs = rest.split("/")
        if not policy:
            raise ValueError(f"bad setting {text!r}: no policy")
        params: list[tuple[str, Any]] = []
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq or not key:
                raise ValueError(f"bad setting {text!r}: a policy parameter is /KEY=VALUE")
            params.append((key, yaml.safe_load(value)))
        if (at or plus or params) and kind != "fleet-proxy":
            raise ValueError(f"bad setting {text!r}: /K=V, +precise and @wN are fleet-proxy's")
        return cls(kind, policy, workers, bool(plus), tuple(params))

    def routing(self) -> dict[str, Any]:
        """fleet-proxy's routing: section for this setting."""
        out: dict[str, Any] = {"policy": self.policy}
        if self.params:
            out["params"] = dict(self.params)
        if self.precise:
            out["precise_prefix"] = {}
        return out


def _param_text(value: Any) -> str:
    """A parameter's value as it was written (YAML)."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


class PreciseIndexUnused(Exception):
    """A +precise run whose proxy did not route by the engines' KV-cache events. Not a
    RuntimeError, so run_campaign does not skip the setting quietly: the campaign stops."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Proc:
    """A child process in its own process group, logged to a file, stopped by its PID."""

    def __init__(self, cmd: Sequence[str], log: Path) -> None:
        self.log = log
        self._out: IO[bytes] = log.open("wb")
        self.popen = subprocess.Popen(
            list(cmd),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
            # Gone with this script however it ends (a killed campaign left its fleet running).
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        for sig, wait in ((signal.SIGINT, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if not self.alive():
                break
            try:
                os.killpg(self.popen.pid, sig)  # the group this Proc created, nothing else
            except ProcessLookupError:
                break
            try:
                self.popen.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        self._out.close()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a live process and the live processes of its group (Linux /proc),
    start-up included: a Proc leads its own group, so a `--workers N` proxy's workers count."""
    total, leader = 0, False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended since the listing
        if stat.parent.name == str(pid) or int(fields[2]) == pid:
            leader = leader or stat.parent.name == str(pid)
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK") if leader else None


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def sim_lag(url: str) -> float | None:
    """How far the engine's clock fell behind its --speed since start (simulator/engine.py):
    near 0 means the simulated timings held; large means the machine, not the routing,
    set the pace."""
    try:
        with urllib.request.urlopen(f"{url}/_sim/state", timeout=5) as resp:
            return float(orjson.loads(resp.read())["lag_fraction"])
    except (urllib.error.URLError, OSError, KeyError, ValueError):
        return None


def wait_until(check: Any, proc: Proc, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # Alive first: on a shared machine another process may have taken the port the child
        # could not bind, and would answer the check in its place.
        if not proc.alive():
            raise RuntimeError(f"{what} exited; see {proc.log}")
        if check():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout_s:.0f} s; see {proc.log}")


# Every engine binds its publisher and replay socket on free ports (the simulator binds the
# wildcard on its own loopback address).
KV_EVENTS_CONFIG = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": "tcp://*:0",
    "replay_endpoint": "tcp://*:0",
}
KV_EVENTS_LINE = re.compile(r"^(http://\S+) publishes KV events on (\S+?)(?:, replays on (\S+))?$")


def kv_event_endpoints(log: Path) -> dict[str, tuple[str, str | None]]:
    """Each engine's URL -> its KV-events publisher and replay socket, from the fleet's log."""
    found: dict[str, tuple[str, str | None]] = {}
    for line in log.read_text().splitlines():
        if m := KV_EVENTS_LINE.match(line.strip()):
            found[m[1]] = (m[2], m[3])
    return found


def start_fleet(
    args: argparse.Namespace, logs: Path, tag: str, kv_events: bool = False
) -> tuple[Proc, list[str]]:
    """A `fleet-proxy sim` fleet and its engines' URLs; with kv_events, every engine publishes
    its KV-cache events (kv_event_endpoints reads where from the log)."""
    cmd = [
        sys.executable,
        "-c",
        SIM_MAIN,
        "--engines",
        str(args.engines),
        "--base-port",
        "0",
        "--speed",
        str(args.speed),
        "--profile",
        args.profile,
        "--model",
        args.model,
    ]
    if kv_events:
        cmd += ["--kv-events-config", orjson.dumps(KV_EVENTS_CONFIG).decode()]
    proc = Proc(cmd, logs / f"{tag}-sim.log")

    def urls() -> list[str]:
        lines = proc.log.read_text().splitlines()
        return [x.strip() for x in lines if x.startswith("http://") and " " not in x.strip()]

    def ready() -> bool:
        up = urls()
        if len(up) < args.engines:
            return False
        return not kv_events or set(up[: args.engines]) <= set(kv_event_endpoints(proc.log))

    wait_until(ready, proc, 60, "simulated fleet")
    return proc, urls()[: args.engines]


def proxy_config(
    setting: RouterSetting, urls: list[str], endpoints: dict[str, tuple[str, str | None]]
) -> dict[str, Any]:
    """The --config of a fleet-proxy with policy parameters or +precise: the backends (with
    their KV-events endpoints when +precise), and the policy as `--policy` builds it with its
    parameters and, when +precise, a `precise_prefix` section."""
    backends: list[dict[str, str]] = []
    for url in urls:
        backend = {"url": url}
        if setting.precise:
            publish, replay = endpoints[url]
            backend["kv_events_endpoint"] = publish
            if replay:
                backend["kv_events_replay_endpoint"] = replay
        backends.append(backend)
    return {"backends": backends, "routing": setting.routing()}


def router_command(
    setting: RouterSetting,
    port: int,
    urls: list[str],
    config: Path | None = None,
    peers_venv: Path | None = None,
) -> tuple[list[str], str]:
    """The command line of a router on `port` and the URL that answers 200 when it is up;
    a fleet-proxy with `config` takes its backends and routing from that YAML file; a peer
    router comes from `peers_venv` when given (else this venv, else PATH)."""
    base = f"http://127.0.0.1:{port}"
    if setting.kind == "fleet-proxy":
        if config is not None:
            routing = ["--config", str(config)]
        else:
            routing = [*(a for u in urls for a in ("--backend", u)), "--policy", setting.policy]
        workers = ["--workers", str(setting.workers)] if setting.workers != 1 else []
        return (
            [
                sys.executable,
                "-c",
                PROXY_MAIN,
                "serve",
                "--port",
                str(port),
                *routing,
                *workers,
                "--log-level",
                "warning",
            ],
            f"{base}/ready",
        )
    exe = router_executable(setting.kind, peers_venv)
    if exe is None:
        raise FileNotFoundError(setting.kind)
    launch = ["launch"] if setting.kind == "sglang-router" else []
    # Their Prometheus exporters default to fixed ports; give each run its own.
    return (
        [
            exe,
            *launch,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *urls,
            "--policy",
            setting.policy,
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warning" if setting.kind == "vllm-router" else "warn",
        ],
        f"{base}/health",
    )


def worker_metrics(port: int, workers: int, timeout_s: float = 30.0) -> dict[int, str]:
    """Every worker's /metrics text by worker index. Each worker keeps its own metrics: ask
    /admin/workers which one answers, then /metrics on the same keep-alive connection, over new
    connections (the kernel spreads them) until every worker has answered or time is up."""
    found: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(found) < workers and time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/admin/workers")
            who = int(orjson.loads(conn.getresponse().read())["answered_by"])
            conn.request("GET", "/metrics")
            found.setdefault(who, conn.getresponse().read().decode())
        except (OSError, http.client.HTTPException, KeyError, ValueError):
            time.sleep(0.2)
        finally:
            conn.close()
    return found


def precise_index_state(metrics: str, engines: int) -> dict[str, Any]:
    """What one proxy process's /metrics says of its precise index, and whether routing used it:
    events applied and blocks indexed for every backend, every backend trusted
    (fleet_proxy_kv_index_precise 1), and prompts tokenized for the index."""
    backends: dict[str, dict[str, float]] = {}
    tokenize: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "fleet_proxy_kv_prompt_tokenize_total":
                tokenize[sample.labels["outcome"]] = sample.value
                continue
            key = sample.name.removeprefix("fleet_proxy_kv_").removesuffix("_total")
            if sample.name.startswith("fleet_proxy_kv_") and "backend" in sample.labels:
                if "reason" in sample.labels:
                    key = f"{key}_{sample.labels['reason']}"
                row = backends.setdefault(sample.labels["backend"], {})
                row[key] = row.get(key, 0.0) + sample.value
    problems = []
    if len(backends) < engines:
        problems.append(f"{len(backends)} of {engines} backends subscribed")
    for backend, row in backends.items():
        if not row.get("events"):
            problems.append(f"{backend}: no events applied")
        if not row.get("blocks_indexed"):
            problems.append(f"{backend}: no blocks indexed")
        if row.get("index_precise") != 1:
            problems.append(f"{backend}: index not trusted")
    if not tokenize.get("tokenized", 0) + tokenize.get("cached", 0):
        problems.append("no prompt tokenized for the precise index")
    return {"backends": backends, "prompt_tokenize": tokenize, "problems": problems}


def check_precise(port: int, setting: RouterSetting, engines: int, bundle: Path) -> None:
    """Record every worker's precise-index state in the bundle; stop the campaign if any
    worker did not route by the engines' events."""
    found = worker_metrics(port, setting.workers)
    states = {str(w): precise_index_state(text, engines) for w, text in sorted(found.items())}
    problems = [f"worker {w}: {p}" for w, st in states.items() for p in st["problems"]]
    problems += [f"worker {w}: no /metrics" for w in range(setting.workers) if w not in found]
    write_json(bundle / "precise.json", {"workers": states, "problems": problems})
    if problems:
        raise PreciseIndexUnused(f"{setting.label}: " + "; ".join(problems))


def add_peer_options(p: argparse.ArgumentParser) -> None:
    """Where the peer routers come from, and how long a router may take to serve."""
    p.add_argument(
        "--peers-venv",
        type=Path,
        help="a venv holding vllm-router and sglang-router (pip install vllm-router "
        "sglang-router), kept apart from fleet-proxy's; default: this venv, then PATH",
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        help="seconds a router may take to serve its first completion (sglang-router "
        "registers its workers 30-60 s after start)",
    )


def parsed_bench_args(bench_args: Sequence[str]) -> argparse.Namespace:
    """The `fleet-proxy bench` flags as the bench itself reads them (a placeholder target: the
    script supplies the real ones per run); exits with argparse's message when they are wrong."""
    from bench.cli import build_parser

    return build_parser().parse_args(["--target", "http://127.0.0.1:1", *bench_args])


def check_bench_args(bench_args: Sequence[str]) -> None:
    """End the script, before any fleet starts, when the bench flags are wrong or need a
    module that is not installed (the ShareGPT data, ijson, scipy)."""
    from bench.cli import check_extras

    parsed = parsed_bench_args(bench_args)
    try:
        check_extras(parsed, 1)
    except ValueError as e:
        raise SystemExit(f"{Path(sys.argv[0]).name}: {e}") from None


def split_bench_args(argv: list[str], default: Sequence[str]) -> tuple[list[str], list[str]]:
    """This script's own flags, and the `fleet-proxy bench` flags after `--` (else `default`)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, list(default)


def run_campaign(
    labels: Sequence[str], repeat: int, run: Callable[[int, int], Path]
) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """Alternate the settings `repeat` times (A B C A B C ...): `run(i, k)` is run k of
    setting i and returns its bundle. A setting whose router is not installed or fails to
    start is skipped from then on; Ctrl-C keeps what ran."""
    bundles: dict[str, list[Path]] = {label: [] for label in labels}
    skipped: dict[str, str] = {}
    try:
        for k in range(repeat):
            for i, label in enumerate(labels):
                if label in skipped:
                    continue
                print(f"== {label} run {k}  load {os.getloadavg()[0]:.1f}", flush=True)
                try:
                    bundles[label].append(run(i, k))
                except FileNotFoundError as e:
                    skipped[label] = f"{e} not installed"
                except RuntimeError as e:
                    skipped[label] = str(e)
                    print(f"   skipped: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted: tabulating what ran", file=sys.stderr)
    return bundles, skipped


# What a router that could not bind says, in lower case: the Rust routers' "Address already
# in use (os error 98)", uvicorn's "address already in use".
PORT_TAKEN = "address already in use"


def start_router(
    setting: RouterSetting,
    urls: list[str],
    config: Path | None,
    peers_venv: Path | None,
    logs: Path,
    tries: int = 3,
) -> tuple[Proc, int]:
    """A router up (its own socket on the port, its health route answering) and its port. A
    router that could not bind the free port it was given, or its metrics port (another
    process took it between the pick and the bind: the machine is shared), is started again
    on fresh ones."""
    attempt = 1
    while True:
        port = free_port()
        cmd, ready = router_command(setting, port, urls, config, peers_venv)
        suffix = "" if attempt == 1 else str(attempt)
        router = Proc(cmd, logs.with_name(f"{logs.name}-router{suffix}.log"))
        pid = router.popen.pid

        def up(url: str = ready, pid: int = pid, port: int = port) -> bool:
            # Its own socket answering, not another process that took the port.
            return group_listens_on(pid, port) and answers(url)

        try:
            wait_until(up, router, 60, setting.label)
            return router, port
        except RuntimeError:
            router.stop()
            said = router.log.read_text(errors="replace").lower()
            if attempt == tries or PORT_TAKEN not in said:
                raise
            attempt += 1


def run_setting(
    setting: RouterSetting, k: int, args: argparse.Namespace, bench_args: list[str], out: Path
) -> Path:
    tag = f"{setting.file_tag}-{k}"
    logs = out / "logs"
    bundle = out / "runs" / tag
    fleet, urls = start_fleet(args, logs, tag, kv_events=setting.precise)
    router: Proc | None = None
    try:
        bundle.mkdir(parents=True, exist_ok=True)
        config = None
        if setting.precise or setting.params:
            config = bundle / "proxy.yaml"
            endpoints = kv_event_endpoints(fleet.log) if setting.precise else {}
            text = proxy_config(setting, urls, endpoints)
            config.write_text(yaml.safe_dump(text, sort_keys=False))
        started = time.monotonic()
        router, port = start_router(setting, urls, config, args.peers_venv, logs / tag)
        base = f"http://127.0.0.1:{port}"
        # The engines' model, not the router's list (sglang-router lists a vLLM model as
        # `unknown`); the run starts once the router has served a completion naming it.
        model = fleet_model(urls[0])
        served = wait_until_serving(
            base, model, bench_api(bench_args), alive=router.alive, timeout_s=args.ready_timeout
        )
        served_at = time.monotonic()
        if not router.alive():  # what answered was another process on its port
            raise RuntimeError(f"{setting.label} exited; see {router.log}")
        cpu_at_ready = cpu_seconds(router.popen.pid)
        load_before = load_now()
        if warning := busy_warning(load_before, cores(), f"before {tag}"):
            print(warning, file=sys.stderr, flush=True)
        # The bench prints its own report; keep it in the bundle, not on the terminal.
        with (bundle / "bench.out").open("w") as f, contextlib.redirect_stdout(f):
            code = bench_main(
                [
                    "--target",
                    f"{setting.label}={base}",
                    "--model",
                    model,
                    "--backend-metrics",
                    *urls,
                    "--router-setting",
                    f"router={setting.kind}",
                    "--router-setting",
                    f"policy={setting.policy}",
                    "--out",
                    str(bundle),
                    "--no-progress",
                    *bench_args,
                ]
            )
        load_after = load_now()
        if warning := busy_warning(load_after, cores(), f"after {tag}"):
            print(warning, file=sys.stderr, flush=True)
        if code != 0:
            raise RuntimeError(f"bench exited {code} for {setting.label}")
        if setting.precise:
            check_precise(port, setting, len(urls), bundle)
        costs = {
            "router_cpu_s": _minus(cpu_seconds(router.popen.pid), cpu_at_ready),
            "sim_lag_fraction": [sim_lag(u) for u in urls],
            "load_before": load_before,
            "load_after": load_after,
            "cores": cores(),
            "model": model,
            "ready_s": round(served_at - started, 2),  # from the router's start
            "ready_attempts": served.attempts,
            "ready_refusals": list(served.refusals),
        }
        write_json(bundle / "costs.json", costs)
    finally:
        if router is not None:
            router.stop()
        fleet.stop()
    return bundle


def load_run(bundle: Path) -> tuple[RunResult, dict[str, Any]]:
    summary = orjson.loads((bundle / "summary.json").read_bytes())
    config = orjson.loads((bundle / "config.json").read_bytes())
    run = summary["runs"][0]
    costs = bundle / "costs.json"
    run["costs"] = orjson.loads(costs.read_bytes()) if costs.exists() else {}
    return RunResult(run["setting"], 0, read_records(bundle / "metrics.jsonl"), run), config


def _worst(values: list[float]) -> str:
    return f"{max(values):.1f}" if values else "-"


def costs_table(runs: dict[str, list[tuple[RunResult, dict[str, Any]]]]) -> str:
    """What each setting cost the machine (the router's CPU, the simulator's lag), what the
    machine's load was around its runs, and how long its router took to serve a first
    completion."""
    rows = [
        "| setting | router CPU s per run | router CPU ms/request | sim lag % (worst engine) "
        "| load 1-min before / after (worst run) | first completion, s after start (worst run) |",
        "|---|---|---|---|---|---|",
    ]
    for label, items in runs.items():
        cpu = [c for r, _ in items if (c := dig(r.summary, "costs", "router_cpu_s")) is not None]
        n = sum(len(r.records) for r, _ in items)
        lags = [
            x
            for r, _ in items
            for x in dig(r.summary, "costs", "sim_lag_fraction") or []
            if x is not None
        ]
        cells = [label]
        cells += (
            [f"{sum(cpu) / len(cpu):.2f}", f"{sum(cpu) / n * 1000:.2f}"]
            if cpu and n
            else ["-", "-"]
        )
        cells.append(f"{max(lags) * 100:.1f}" if lags else "-")

        def worst(key: str, items: list[tuple[RunResult, dict[str, Any]]] = items) -> list[float]:
            found = [dig(r.summary, "costs", key) for r, _ in items]
            return [x[0] if isinstance(x, list) else x for x in found if x is not None]

        cells.append(f"{_worst(worst('load_before'))} / {_worst(worst('load_after'))}")
        cells.append(_worst(worst("ready_s")))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def spread_table(runs: dict[str, list[tuple[RunResult, dict[str, Any]]]]) -> str:
    """Requests each engine finished, run by run (busiest first), from the engines' /metrics,
    and the busiest engine over the mean, averaged over the runs."""
    rows = [
        "| setting | requests per engine, each run | max/mean |",
        "|---|---|---|",
    ]
    for label, items in runs.items():
        spreads = [spread(r.summary) for r, _ in items]
        ratios = [x["max_over_mean"] for x in spreads if x["max_over_mean"] is not None]
        counts = "; ".join(counts_text(x["per_engine"]) for x in spreads)
        mean = f"{sum(ratios) / len(ratios):.2f}" if ratios else "-"
        rows.append(f"| {label} | {counts} | {mean} |")
    return "\n".join(rows)


def busy_lines(runs: dict[str, list[tuple[RunResult, dict[str, Any]]]]) -> list[str]:
    """A warning paragraph when the 1-minute load exceeded the cores around any run."""
    warning = busy_summary(
        [
            (f"{label} run {k}", r.summary.get("costs") or {})
            for label, items in runs.items()
            for k, (r, _) in enumerate(items)
        ]
    )
    return [] if warning is None else [warning, ""]


def run_balance(summary: dict[str, Any]) -> float | None:
    """Requests max/min across engines: from x-fleet-backend when the router sets it, else from
    the engines' request counters."""
    for path in (
        ("balance", "requests_max_over_min"),
        ("backend_metrics", "requests_max_over_min"),
    ):
        value = dig(summary, *path)
        if value is not None:
            return float(value)
    return None


def combine(
    out: Path,
    bundles: dict[str, list[Path]],
    skipped: dict[str, str],
    args: argparse.Namespace,
    bench_args: list[str],
) -> str:
    runs = {label: [load_run(b) for b in paths] for label, paths in bundles.items() if paths}
    if not runs:
        return "no setting ran"
    first_config = next(iter(runs.values()))[0][1]
    slo = parse_slo([f"{k}:{v}" for k, v in first_config["slo_ms"].items()])
    pooled = {}
    for label, items in runs.items():
        results = [r for r, _ in items]
        # Fresh fleets listen on fresh ports, so engine ids differ run to run: balance is
        # averaged per run rather than pooled over ids.
        s = pooled_summary(results, slo, ())
        ratios = [v for r in results if (v := run_balance(r.summary)) is not None]
        s["balance"] = {"requests_max_over_min": sum(ratios) / len(ratios) if ratios else None}
        spreads = [spread(r.summary) for r in results]
        means = [x["max_over_mean"] for x in spreads if x["max_over_mean"] is not None]
        s["spread"] = {
            "runs": spreads,
            "requests_max_over_mean": sum(means) / len(means) if means else None,
        }
        s["machine"] = {
            "cores": cores(),
            "load_before": [dig(r.summary, "costs", "load_before") for r in results],
            "load_after": [dig(r.summary, "costs", "load_after") for r in results],
        }
        pooled[label] = s
    labels = list(runs)
    comparisons = {}
    for other in labels[1:]:
        n = min(len(runs[labels[0]]), len(runs[other]))
        if n >= 2:
            comparisons[other] = compare_settings(
                [r.summary for r, _ in runs[labels[0]][:n]], [r.summary for r, _ in runs[other][:n]]
            )
    from bench.plots import Panel, cdf_figure  # matplotlib: checked in main, before the runs

    cdf_figure(
        [
            Panel(
                "TTFT CDF",
                "TTFT (ms)",
                {
                    label: [
                        x.ttft_s * 1000 for r, _ in items for x in r.records if x.ttft_s is not None
                    ]
                    for label, items in runs.items()
                },
            ),
            Panel(
                "E2E CDF",
                "E2E (ms)",
                {
                    label: [x.e2e_s * 1000 for r, _ in items for x in r.records if x.ok and x.e2e_s]
                    for label, items in runs.items()
                },
            ),
        ],
        out / "peers.png",
    )
    lines = [
        "# Peer routers on one simulated fleet",
        "",
        f"Fleet: {args.engines} simulated engines, profile {args.profile}, speed {args.speed}; "
        f"{first_config['workload']['requests']} requests per run, {args.repeat} run(s) per "
        f"setting, a fresh fleet and router for each run.",
        "",
        f"Bench: `{' '.join(bench_args)}`",
        "",
        settings_table(pooled),
        "",
        "Latencies in ms of wall time; prefix hit % and balance from the engines' /metrics "
        "(or x-fleet-backend).",
        "",
        costs_table(runs),
        "",
        "Router CPU: from ready to the end of the run. Sim lag: how much longer the engines' "
        "steps took than the profile says; when it is large the shared cores, not the "
        "routing, set the pace (lower --speed or the load). Load: the 1-minute load average "
        f"just before and after the replay, on {cores()} cores. First completion: how long "
        "after it was started the router served its first completion (each run starts then; "
        "a router's health route may answer sooner).",
        "",
        spread_table(runs),
        "",
        "Requests per engine: finished during the run, from the engines' /metrics; max/mean "
        "is 1.00 when every engine served as many.",
        "",
        *busy_lines(runs),
    ]
    for other, rows in comparisons.items():
        lines += [comparison_table(labels[0], other, rows), ""]
    if skipped:
        lines += ["Not run: " + ", ".join(f"{k} ({v})" for k, v in skipped.items()), ""]
    lines.append("![TTFT and E2E CDFs](peers.png)")
    text = "\n".join(lines) + "\n"
    (out / "peers.md").write_text(text)
    write_json(
        out / "peers.json", {"settings": pooled, "comparison": comparisons, "skipped": skipped}
    )
    return text


def main(argv: list[str]) -> int:
    argv, bench_args = split_bench_args(argv, DEFAULT_BENCH_ARGS)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--speed", type=float, default=2.0, help="simulator clock speed")
    p.add_argument("--profile", default="h100-llama-8b")
    p.add_argument("--model", default="sim-llama-8b")
    p.add_argument(
        "--settings",
        default=",".join(DEFAULT_SETTINGS),
        help="comma-separated ROUTER:POLICY, fleet-proxy's optionally /KEY=VALUE policy "
        "parameters, +precise, then @wN (fleet-proxy:unified/overload_factor=1.5+precise@w2); "
        "the first is the baseline",
    )
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs") / time.strftime("peers-%Y%m%d-%H%M%S"))
    add_peer_options(p)
    args = p.parse_args(argv)
    require_module("matplotlib", "compare_peers.py", "the CDF plots", MATPLOTLIB_INSTALL)
    check_bench_args(bench_args)
    settings = [RouterSetting.parse(s.strip()) for s in args.settings.split(",") if s.strip()]
    out: Path = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    bundles, skipped = run_campaign(
        [s.label for s in settings],
        args.repeat,
        lambda i, k: run_setting(settings[i], k, args, bench_args, out),
    )
    print(combine(out, bundles, skipped, args, bench_args))
    print(f"artifacts: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
