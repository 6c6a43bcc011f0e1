"""Flow control's scenarios on simulated engines (few sequences each, so the fleet saturates),
each variant run `--repeats` times with the variants interleaved (their order rotating), a
fresh fleet and proxy per run, and each variant compared with the scenario's baseline as
paired runs: the mean difference with its 95% interval (Student's t over the repeats).

- `noisy`: a quiet tenant A sends short streamed requests at a steady rate (`--quiet-rate`
  per second, open loop), a noisy tenant B keeps `--noisy-factor` times the fleet's sequences
  (`engines x max_num_seqs`) of ~8k-character streamed prompts in flight. Variants: A
  `alone`, no flow control (`off`), flow control as one FIFO queue (`fifo`: every request
  one tenant), `round_robin` and `token_weighted` fairness, the engines' seats configured
  (`seats`: nothing waits in an engine), seats with fair-share preemption (`fair_share`),
  and with one seat kept for a tenant running nothing (`reserved`). Prints A's TTFT p50 /
  p90 (baseline: alone) and B's answers.
- `priorities`: twice the fleet's sequences in flight, half critical streams and half
  sheddable (batch) ones; without flow control, with it, and with it and preemption. Prints
  the critical band's TTFT SLO attainment (`--ttft-slo`), the client errors, the tokens the
  batch clients lost (asked for and never received) and the tokens the engines recomputed
  for suspended streams (baseline: off).
- `agents`: Autellix-style programs, each a chain of calls sharing an `x-program-id`: long
  programs all started at once, short ones (2 calls) arriving one every `--short-every`
  seconds while they run; FCFS against least attained service (`las`). Prints the programs'
  completion times (p50, p90) per kind (baseline: fcfs).
- `cost`: the proxy's CPU per request below saturation, with flow control configured (and a
  rate limit) and without: the proxy runs as its own process (`fleet-proxy serve`) and its
  CPU time is read from /proc before and after a run of sequential requests (baseline: off).

Everything shares this machine: run it on an otherwise idle one, and give the load average.

    python scripts/bench_flow_control.py [--scenarios noisy,priorities,agents,cost]
        [--repeats 3] [--duration 15] [--engines 2] [--max-num-seqs 4] [--out FILE.json]
        [--processes [--proxy-workers N]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import uvicorn
import yaml

from bench.paired import paired_difference, t_quantile
from proxy.serving.app import create_app
from proxy.serving.front_door import uvicorn_config
from proxy.settings import load_settings
from simulator.fleet import DEFAULT_MODEL, start_fleet
from simulator.profiles import DEFAULT_PROFILE, load_profile

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "simulator" / "profiles"
# The proxy holds requests as soon as one waits on every engine, so the queue forms in the
# proxy (where priorities, fairness and ordering apply) rather than in the engines.
HOLD_EARLY = {"saturation": {"queue_depth_threshold": 1}}
# Every request one tenant: the fairness header is one no client sends.
ONE_QUEUE = {"fairness_header": "x-bench-nobody-sends-this"}
SEATS = "engine seats"  # a placeholder for --max-num-seqs
NOISY: dict[str, dict[str, Any] | None] = {
    "alone": None,
    "off": None,
    "fifo": {**HOLD_EARLY, **ONE_QUEUE},
    "round_robin": {**HOLD_EARLY, "fairness": "round_robin"},
    "token_weighted": {**HOLD_EARLY, "fairness": "token_weighted"},
    # The engines' seats (`--max-num-seqs`, filled in when run): nothing waits in an engine.
    "seats": {"saturation": {"max_num_seqs": SEATS}},
    "fair_share": {"saturation": {"max_num_seqs": SEATS}, "fair_share_preemption": True},
    # And one seat of the pool kept for a tenant running nothing: A starts without waiting for
    # a suspension, B runs on one seat fewer.
    "reserved": {
        "saturation": {"max_num_seqs": SEATS},
        "fair_share_preemption": True,
        "fair_share_reserved_seats": 1,
    },
}
BANDS = {"objectives": {"critical": 10, "batch": -1}}
PRIORITIES: dict[str, dict[str, Any] | None] = {
    "off": None,
    "flow": {**HOLD_EARLY, **BANDS},
    "flow+preemption": {**HOLD_EARLY, **BANDS, "preemption": True},
}
ORDERINGS: dict[str, dict[str, Any] | None] = {
    "fcfs": {**HOLD_EARLY, "ordering": "fcfs"},
    "las": {**HOLD_EARLY, "ordering": "las"},
}
COST: dict[str, dict[str, Any] | None] = {
    "off": None,
    "flow": {},
    "flow+rate_limits": {"rate_limits": {"default": {"requests_per_minute": 10_000_000}}},
}
LONG_PROMPT = "The fleet serves many tenants at once. " * 200  # ~8k characters
SHORT_PROMPT = "Say hello."


def body(prompt: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
        "stream": stream,
    }  # fmt: skip


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Engines(Protocol):
    """Simulated engines, in this process (SimFleet) or in one of their own."""

    @property
    def urls(self) -> list[str]: ...


@dataclass(frozen=True)
class EngineProcess:
    urls: list[str]


LIMITS = httpx.Limits(max_connections=1000)


def profile_file(folder: Path, max_num_seqs: int) -> Path:
    """The shipped default profile with `max_num_seqs`, as a file `fleet-proxy sim` reads."""
    shipped = yaml.safe_load((PROFILES / f"{DEFAULT_PROFILE}.yaml").read_text())
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump({**shipped, "max_num_seqs": max_num_seqs}))
    return path


@contextlib.asynccontextmanager
async def engines(args: argparse.Namespace) -> AsyncIterator[Engines]:
    """A fresh fleet: in this process, or with `--processes` as `fleet-proxy sim` (its own
    process, so the clients' and the proxy's work does not slow its clock)."""
    profile = load_profile(DEFAULT_PROFILE).with_overrides(max_num_seqs=args.max_num_seqs)
    if not args.processes:
        async with await start_fleet(args.engines, profile=profile, speed=args.speed) as fleet:
            yield fleet
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = profile_file(Path(tmp), args.max_num_seqs)
        cmd = [sys.executable, "-m", "proxy.serving.cli", "sim", "--engines", str(args.engines)]
        cmd += ["--base-port", "0", "--speed", str(args.speed), "--profile", str(path)]
        p = await asyncio.create_subprocess_exec(
            *cmd, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        try:
            assert p.stdout is not None
            urls = []
            for _ in range(args.engines):  # it prints each engine's URL on a line of its own
                line = await asyncio.wait_for(p.stdout.readline(), timeout=60)
                urls.append(line.decode().strip())
            if not all(u.startswith("http://") for u in urls):
                raise SystemExit(f"the simulator did not start: {urls}")
            async with httpx.AsyncClient(timeout=5) as c:
                for url in urls:
                    for _ in range(600):  # bounded: 30 s for each engine to answer
                        with contextlib.suppress(httpx.HTTPError):
                            if (await c.get(url + "/health")).status_code == 200:
                                break
                        await asyncio.sleep(0.05)
            yield EngineProcess(urls)
        finally:
            p.terminate()
            await asyncio.wait_for(p.wait(), timeout=30)


@contextlib.asynccontextmanager
async def serving(
    fleet: Engines, flow: dict[str, Any] | None, own_process: bool = False, workers: int = 1
) -> AsyncIterator[httpx.AsyncClient]:
    """fleet-proxy in front of `fleet`, every engine scraped, and a client: in this process
    (scraping every 50 ms), or as `fleet-proxy serve` with its defaults (`own_process`, with
    `workers` worker processes)."""
    if own_process:
        async with (
            proxy_process(fleet, flow, workers) as (_, url),
            httpx.AsyncClient(base_url=url, timeout=120, limits=LIMITS) as c,
        ):
            await ready(c, len(fleet.urls))
            yield c
        return
    settings: dict[str, Any] = {"backends": fleet.urls, "scrape_interval": 0.05}
    if flow is not None:
        settings["flow_control"] = flow
    app = create_app(load_settings(settings))
    config = uvicorn_config(app, app.core.settings, port=0, loop="none", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(600):  # bounded: 30 s for the proxy to listen
            if server.started or task.done():
                break
            await asyncio.sleep(0.05)  # uvicorn offers no event to wait on
        if not server.started:
            raise SystemExit("fleet-proxy did not start listening")
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=120, limits=LIMITS
        ) as c:
            await ready(c, len(fleet.urls))
            yield c
    finally:
        server.should_exit = True
        await task


async def ready(c: httpx.AsyncClient, backends: int) -> None:
    for _ in range(600):  # bounded: 30 s for a first scrape of every engine
        with contextlib.suppress(httpx.HTTPError):
            if (await c.get("/ready")).json().get("backends") == backends:
                return
        await asyncio.sleep(0.05)


async def metric_sum(c: httpx.AsyncClient, name: str) -> float:
    text = (await c.get("/metrics")).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name))


# --- noisy neighbour


async def tenant_loop(
    client: httpx.AsyncClient, tenant: str, prompt: str, max_tokens: int, until: float,
    statuses: dict[int, int],
) -> None:  # fmt: skip
    """One closed-loop client of streamed requests: its next as soon as the last is answered."""
    headers = {"x-gateway-fairness-id": tenant}
    while time.monotonic() < until:
        payload = body(prompt, max_tokens, stream=True)
        async with client.stream("POST", "/v1/completions", json=payload, headers=headers) as r:
            async for _ in r.aiter_bytes():
                pass
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if r.status_code != 200:
            await asyncio.sleep(0.05)  # refused: back off a little, as a client would


async def steady_tenant(
    c: httpx.AsyncClient, tenant: str, rate: float, until: float, tally: StreamTally
) -> None:
    """Streamed short requests at `rate` per second, whether the last was answered or not."""
    headers = {"x-gateway-fairness-id": tenant}
    sent: list[asyncio.Task[None]] = []
    at = time.monotonic()
    while at < until:
        sent.append(asyncio.create_task(stream_once(c, headers, 32, tally)))
        at += 1.0 / rate
        await asyncio.sleep(max(0.0, at - time.monotonic()))
    await asyncio.gather(*sent)


async def noisy(
    fleet: Engines, args: argparse.Namespace, variant: str, flow: dict[str, Any] | None
) -> Metrics:
    if flow is not None and flow.get("saturation", {}).get("max_num_seqs") == SEATS:
        flow = {**flow, "saturation": {"max_num_seqs": args.max_num_seqs}}
    async with serving(fleet, flow, args.processes, args.proxy_workers) as c:
        until = time.monotonic() + args.duration
        quiet = StreamTally()
        loud: dict[int, int] = {}
        if args.processes:
            # A's client in a process of its own: B's hundreds of clients in this one would
            # delay A's reading of its first token, and that delay is not the proxy's.
            runs = [quiet_process(str(c.base_url), args, quiet)]
        else:
            runs = [steady_tenant(c, "quiet", args.quiet_rate, until, quiet)]
        if variant != "alone":
            crowd = round(args.noisy_factor * args.engines * args.max_num_seqs)
            runs += [tenant_loop(c, "noisy", LONG_PROMPT, 32, until, loud) for _ in range(crowd)]
        await asyncio.gather(*runs)
        preempted = await metric_sum(c, "fleet_proxy_flow_control_preemptions_total")
    return {
        "preemptions": preempted,
        "A TTFT p50 ms": quantile(quiet.ttfts, 0.5) * 1000,
        "A TTFT p90 ms": quantile(quiet.ttfts, 0.9) * 1000,
        "A answered": len(quiet.ttfts),
        "A errors": quiet.errors,
        "B answered": loud.get(200, 0),
    }


async def quiet_process(url: str, args: argparse.Namespace, tally: StreamTally) -> None:
    """`steady_tenant` run by this script in another process (`--quiet-client URL`)."""
    cmd = [sys.executable, __file__, "--quiet-client", url, "--duration", str(args.duration)]
    cmd += ["--quiet-rate", str(args.quiet_rate)]
    p = await asyncio.create_subprocess_exec(*cmd, cwd=REPO, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(p.communicate(), timeout=args.duration + 300)
    got = json.loads(out)
    tally.ttfts += got["ttfts"]
    tally.errors += got["errors"]


async def quiet_client(url: str, args: argparse.Namespace) -> None:
    """The other side of `quiet_process`: A's requests, its tally printed as JSON."""
    tally = StreamTally()
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=LIMITS) as c:
        await steady_tenant(c, "quiet", args.quiet_rate, time.monotonic() + args.duration, tally)
    print(json.dumps({"ttfts": tally.ttfts, "errors": tally.errors}))


# --- priorities under overload


@dataclass
class StreamTally:
    ttfts: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0  # refusals, and streams cut short (an error event, no finish_reason)
    lost_tokens: int = 0  # tokens a cut stream's client asked for (ignore_eos) and never got


async def stream_once(
    c: httpx.AsyncClient, headers: dict[str, str], max_tokens: int, tally: StreamTally
) -> None:
    start = time.monotonic()
    received = 0
    first: float | None = None
    failed = False
    finished = False
    payload = body(SHORT_PROMPT, max_tokens, stream=True)
    async with c.stream("POST", "/v1/completions", json=payload, headers=headers) as r:
        tally.statuses[r.status_code] = tally.statuses.get(r.status_code, 0) + 1
        if r.status_code != 200:
            await r.aread()
            tally.errors += 1
            await asyncio.sleep(0.05)  # refused: back off a little, as a client would
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                failed = True
                continue
            choice = (event.get("choices") or [{}])[0]
            if choice.get("text"):
                received += 1
                if first is None:
                    first = time.monotonic() - start
            finished = finished or choice.get("finish_reason") is not None
    if first is not None:
        tally.ttfts.append(first)
    if failed or not finished:  # cut short: what it had not received is lost to it
        tally.errors += 1
        tally.lost_tokens += max(0, max_tokens - received)


async def band_loop(
    c: httpx.AsyncClient, objective: str, max_tokens: int, until: float, tally: StreamTally
) -> None:
    headers = {"x-gateway-inference-objective": objective}
    while time.monotonic() < until:
        await stream_once(c, headers, max_tokens, tally)


async def priorities(
    fleet: Engines, args: argparse.Namespace, variant: str, flow: dict[str, Any] | None
) -> Metrics:
    slots = args.engines * args.max_num_seqs  # twice this many in flight: 2x overload
    async with serving(fleet, flow, args.processes, args.proxy_workers) as c:
        until = time.monotonic() + args.duration
        critical, batch = StreamTally(), StreamTally()
        await asyncio.gather(
            *(band_loop(c, "critical", 16, until, critical) for _ in range(slots)),
            *(band_loop(c, "batch", 128, until, batch) for _ in range(slots)),
        )
        recomputed = await metric_sum(c, "fleet_proxy_migration_recomputed_tokens_total")
        preempted = await metric_sum(c, "fleet_proxy_flow_control_preemptions_total")
    met = sum(1 for t in critical.ttfts if t <= args.ttft_slo)
    return {
        "critical SLO %": 100 * met / len(critical.ttfts) if critical.ttfts else math.nan,
        "critical TTFT p90 ms": quantile(critical.ttfts, 0.9) * 1000,
        "critical streams": len(critical.ttfts),
        "batch streams": len(batch.ttfts),
        "client errors": critical.errors + batch.errors,
        "lost tokens": batch.lost_tokens + critical.lost_tokens,
        "preemptions": preempted,
        "recomputed tokens": recomputed,
    }


# --- agent programs


async def program(c: httpx.AsyncClient, pid: str, calls: int, done: list[float]) -> None:
    start = time.monotonic()
    headers = {"x-program-id": pid}
    for _ in range(calls):  # each call waits for the one before, as an agent's steps do
        r = await c.post("/v1/completions", json=body(SHORT_PROMPT, 32), headers=headers)
        if r.status_code != 200:
            return  # a failed program has no completion time
    done.append(time.monotonic() - start)


async def arriving(c: httpx.AsyncClient, pid: str, after: float, done: list[float]) -> None:
    """A short program (2 calls) starting `after` seconds in, while the long ones run."""
    await asyncio.sleep(after)
    await program(c, pid, 2, done)


async def agents(
    fleet: Engines, args: argparse.Namespace, variant: str, flow: dict[str, Any] | None
) -> Metrics:
    async with serving(fleet, flow, args.processes, args.proxy_workers) as c:
        short: list[float] = []
        long: list[float] = []
        runs = [program(c, f"long-{i}", args.long_calls, long) for i in range(args.long_programs)]
        runs += [
            arriving(c, f"short-{i}", args.short_every * (i + 1), short)
            for i in range(args.short_programs)
        ]
        await asyncio.gather(*runs)
    every = short + long
    return {
        "all p50 s": quantile(every, 0.5),
        "all p90 s": quantile(every, 0.9),
        "short p50 s": quantile(short, 0.5),
        "short p90 s": quantile(short, 0.9),
        "long p50 s": quantile(long, 0.5),
        "long p90 s": quantile(long, 0.9),
        "programs done": len(every),
    }


# --- the cost below saturation


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its children that have been waited for (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def proxy_process(
    fleet: Engines, flow: dict[str, Any] | None, workers: int = 1
) -> AsyncIterator[tuple[int, str]]:
    """`fleet-proxy serve` as its own process: (pid, base url)."""
    cmd = [sys.executable, "-m", "proxy.serving.cli", "serve", "--port", "0"]
    cmd += ["--log-level", "warning", "--workers", str(workers)]
    for url in fleet.urls:
        cmd += ["--backend", url]
    env = dict(os.environ)  # the default scrape interval: less idle CPU to tell apart
    if flow is not None:
        env["FLEET_PROXY_FLOW_CONTROL"] = json.dumps(flow)
    p = await asyncio.create_subprocess_exec(
        *cmd, cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        assert p.stdout is not None
        line = await asyncio.wait_for(p.stdout.readline(), timeout=60)
        m = re.search(rb"base_url = (http://\S+)/v1", line)
        if m is None:
            raise SystemExit(f"fleet-proxy did not start: {line!r}")
        yield p.pid, m.group(1).decode()
    finally:
        p.terminate()
        await asyncio.wait_for(p.wait(), timeout=30)


async def cost(
    fleet: Engines, args: argparse.Namespace, variant: str, flow: dict[str, Any] | None
) -> Metrics:
    async with (
        proxy_process(fleet, None if flow is None else dict(flow)) as (pid, url),
        httpx.AsyncClient(base_url=url, timeout=60) as c,
    ):
        for _ in range(600):  # bounded: 30 s for a first scrape of every engine
            if (await c.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.05)
        await sequential(c, 20)  # warm
        # What the proxy spends with no requests (scrapes, health checks), per second.
        before, start = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(args.idle_seconds)
        idle = (cpu_seconds(pid) - before) / (time.monotonic() - start)
        before, start = cpu_seconds(pid), time.monotonic()
        await sequential(c, args.cost_requests)
        used, wall = cpu_seconds(pid) - before, time.monotonic() - start
    n = args.cost_requests
    return {
        "CPU us/request": used / n * 1e6,
        "CPU us/request less idle": (used - idle * wall) / n * 1e6,
        "idle CPU ms/s": idle * 1e3,
    }


async def sequential(c: httpx.AsyncClient, n: int) -> None:
    for _ in range(n):
        r = await c.post("/v1/completions", json=body(SHORT_PROMPT, 4))
        r.raise_for_status()


Metrics = dict[str, float]
Run = Callable[[Engines, argparse.Namespace, str, "dict[str, Any] | None"], Awaitable[Metrics]]


@dataclass(frozen=True)
class Scenario:
    run: Run
    variants: dict[str, dict[str, Any] | None]
    baseline: str


SCENARIOS: dict[str, Scenario] = {
    "noisy": Scenario(noisy, NOISY, "alone"),
    "priorities": Scenario(priorities, PRIORITIES, "off"),
    "agents": Scenario(agents, ORDERINGS, "fcfs"),
    "cost": Scenario(cost, COST, "off"),
}


def ratio_interval(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """The geometric mean of the paired ratios b/a and its 95% interval (t over the log
    ratios); None with fewer than two usable pairs."""
    logs = [math.log(y / x) for x, y in zip(a, b, strict=True) if x > 0 and y > 0]
    if len(logs) < 2:
        return None
    mean = statistics.fmean(logs)
    half = t_quantile(0.95, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def summarize(name: str, scenario: Scenario, runs: dict[str, list[Metrics]]) -> list[str]:
    base = runs[scenario.baseline]
    lines = [f"== {name}: {len(base)} paired runs per variant, against {scenario.baseline}"]
    for metric in base[0]:
        lines.append(f"  {metric}")
        a = [r[metric] for r in base]
        lines.append(f"    {scenario.baseline:>16}: mean {statistics.fmean(a):.4g}")
        for variant, got in runs.items():
            if variant == scenario.baseline:
                continue
            b = [r[metric] for r in got]
            line = f"    {variant:>16}: mean {statistics.fmean(b):.4g}"
            if len(b) >= 2 and not any(math.isnan(v) for v in a + b):
                d = paired_difference(a, b)
                line += f", diff {d.mean_diff:+.4g} [{d.ci_low:+.4g}, {d.ci_high:+.4g}]"
                ratio = ratio_interval(a, b)
                if ratio is not None:
                    line += f", ratio {ratio[0]:.2f}x [{ratio[1]:.2f}, {ratio[2]:.2f}]"
            lines.append(line)
    return lines


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenarios", default="noisy", help=f"comma list of {', '.join(SCENARIOS)}")
    p.add_argument("--repeats", type=int, default=3, help="paired runs per variant")
    p.add_argument("--variants", help="comma list: only these variants (the baseline always runs)")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per run")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--quiet-rate", type=float, default=4.0, help="noisy: A's requests per second")
    p.add_argument(
        "--noisy-factor",
        type=float,
        default=5.0,
        help="noisy: B's requests in flight per sequence (below 1: the fleet never fills)",
    )
    p.add_argument("--ttft-slo", type=float, default=1.0, help="critical TTFT SLO, seconds")
    p.add_argument("--long-programs", type=int, default=16)
    p.add_argument("--long-calls", type=int, default=20, help="calls of a long program")
    p.add_argument("--short-programs", type=int, default=24, help="2 calls each")
    p.add_argument("--short-every", type=float, default=0.1, help="seconds between short ones")
    p.add_argument("--cost-requests", type=int, default=500)
    p.add_argument("--idle-seconds", type=float, default=3.0, help="cost: idle CPU measured")
    p.add_argument("--speed", type=float, default=4.0, help="simulated time per real second")
    p.add_argument("--out", type=Path, help="write every run's figures here (JSON)")
    p.add_argument(
        "--processes",
        action="store_true",
        help="noisy, priorities, agents: the engines (`fleet-proxy sim`) and the proxy "
        "(`fleet-proxy serve`, default settings) each in a process of its own",
    )
    p.add_argument(
        "--proxy-workers",
        type=int,
        default=1,
        help="with --processes: `fleet-proxy serve --workers N` (noisy, priorities, agents)",
    )
    p.add_argument("--quiet-client", metavar="URL", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.proxy_workers != 1 and not args.processes:
        raise SystemExit("--proxy-workers needs --processes")
    if args.quiet_client:
        await quiet_client(args.quiet_client, args)
        return
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in chosen:
        if s not in SCENARIOS:
            raise SystemExit(f"unknown scenario {s!r}: {', '.join(SCENARIOS)}")
    everything: dict[str, dict[str, list[Metrics]]] = {}
    summary: list[str] = []
    for s in chosen:
        scenario = SCENARIOS[s]
        names = [
            n for n in scenario.variants
            if args.variants is None or n == scenario.baseline or n in args.variants.split(",")
        ]  # fmt: skip
        runs: dict[str, list[Metrics]] = {n: [] for n in names}
        for rep in range(args.repeats):
            shift = rep % len(names)  # each variant takes each place in the order in turn
            for variant in names[shift:] + names[:shift]:
                # Fresh engines per run: one run's leftovers do not slow the next.
                async with engines(args) as fleet:
                    got = await scenario.run(fleet, args, variant, scenario.variants[variant])
                runs[variant].append(got)
                figures = ", ".join(f"{k} {v:.4g}" for k, v in got.items())
                print(f"{s} {variant:>16} run {rep + 1}: {figures}", flush=True)
        everything[s] = runs
        summary += summarize(s, scenario, runs)
    print("\n".join(summary))
    if args.out is not None:
        args.out.write_text(
            json.dumps({"args": vars(args) | {"out": str(args.out)}, "runs": everything}, indent=1)
        )


if __name__ == "__main__":
    asyncio.run(main())
