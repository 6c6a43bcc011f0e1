"""Socket flood: do ordinary clients still get answers while N sockets hold the proxy's
connection table?

Starts `fleet-proxy sim` and `fleet-proxy serve` as child processes on free loopback ports,
then for --seconds keeps N (--sockets) flood sockets open to the proxy in one --mode:

- idle: connect and send nothing;
- partial-header: send "POST /v1/completions HTTP/1.1\\r\\nHost: x\\r\\n" and stop;
- dribble: send whole headers with a content-length and then a byte of body every
  --dribble-every seconds.

A flood socket the proxy closes is opened again (at most --reconnect-rate a second, all
sockets together), as an attacker would. The flood runs in a child process of its own, from
--flood-address. Meanwhile --clients ordinary clients, from --client-address, loop: a fresh
connection, a non-streamed completion, the whole answer read. Reported per phase (before,
during and after the flood): requests, the share answered 200, the other outcomes, latency
p50/p99, and the proxy's RSS; plus the proxy's refusal and eviction counters.

    python scripts/flood.py --mode idle --sockets 10000 --seconds 30
    python scripts/flood.py --mode all --sockets 3000 --proxy-setting client_max_connections=2000

Everything is on loopback (127.0.0.0/8) and bounded: the flood stops after --seconds, every
request after --request-timeout, and the child processes are stopped by their PIDs on every
exit. The open-file limit is raised (up to the hard limit) to fit the sockets; when the hard
limit is lower, fewer sockets are opened and the report says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop
from localproc import ROOT, free_ports, process, wait_http  # scripts/ is on sys.path

MODES = ("idle", "partial-header", "dribble")
MODEL = "sim-llama-8b"
BODY = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 4}).encode()
PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
DRIBBLE_HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100000\r\n\r\n"
)
# Linux's socket option (<linux/in.h>); Python's socket module does not name it.
IP_BIND_ADDRESS_NO_PORT = 24
# Descriptors kept for everything but the sockets (the loop, logs, client connections).
FD_SPARE = 512


def raise_open_files(want: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards `want`, up to the hard limit; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# ---- the flood, in a process of its own ---------------------------------------------------------


class Flood:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.open = 0
        self.opened = 0
        self.closed_by_server = 0
        self.connect_errors = 0
        self._dribbling: set[socket.socket] = set()
        self._next_slot = 0.0

    async def _may_connect(self) -> None:
        """At most --reconnect-rate connects a second: each takes the next free slot."""
        now = time.monotonic()
        slot = self._next_slot = max(now, self._next_slot + 1 / self.args.reconnect_rate)
        if slot > now:
            await asyncio.sleep(slot - now)

    async def one(self) -> None:
        """One flood socket, opened again each time the proxy closes it, until cancelled.
        Plain non-blocking sockets on numeric addresses: no name look-ups, no streams."""
        loop = asyncio.get_running_loop()
        target = (self.args.host, self.args.port)
        while True:
            await self._may_connect()
            sock = socket.socket()
            sock.setblocking(False)
            try:
                # The port is picked at connect (fast) rather than at bind, which walks the
                # ports in use: slow with thousands of sockets on one address.
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                sock.bind((self.args.flood_address, 0))
                await loop.sock_connect(sock, target)
            except OSError:
                sock.close()
                self.connect_errors += 1
                await asyncio.sleep(0.5)
                continue
            self.open += 1
            self.opened += 1
            try:
                if self.args.mode == "partial-header":
                    await loop.sock_sendall(sock, PARTIAL_HEAD)
                elif self.args.mode == "dribble":
                    await loop.sock_sendall(sock, DRIBBLE_HEAD)
                    self._dribbling.add(sock)
                while await loop.sock_recv(sock, 65536):
                    pass  # an answer (503, 408): the close follows
            except OSError:
                pass
            finally:
                self.closed_by_server += 1
                self.open -= 1
                self._dribbling.discard(sock)
                sock.close()

    async def dribble(self) -> None:
        """A byte of body on every dribbling socket each --dribble-every seconds."""
        while True:
            await asyncio.sleep(self.args.dribble_every)
            for sock in list(self._dribbling):
                with contextlib.suppress(OSError):
                    sock.send(b"x")

    async def run(self) -> None:
        stop_at = time.monotonic() + self.args.seconds
        tasks = [asyncio.create_task(self.one()) for _ in range(self.args.sockets)]
        tasks.append(asyncio.create_task(self.dribble()))
        while (left := stop_at - time.monotonic()) > 0:
            await asyncio.sleep(min(1.0, left))
            line = {
                "t": round(self.args.seconds - (stop_at - time.monotonic()), 1),
                "open": self.open,
                "opened": self.opened,
                "closed_by_server": self.closed_by_server,
                "connect_errors": self.connect_errors,
            }
            print(json.dumps(line), flush=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def flood_main(args: argparse.Namespace) -> None:
    raise_open_files(args.sockets + FD_SPARE)
    uvloop.run(Flood(args).run())


# ---- ordinary clients -------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)  # of the requests answered 200
    rss: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        total = sum(self.outcomes.values())
        ok = self.outcomes.get("200", 0)
        s = sorted(self.seconds)

        def pct(q: float) -> float | None:
            return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 1) if s else None

        return {
            "phase": self.name,
            "requests": total,
            "ok_share": round(ok / total, 4) if total else None,
            "outcomes": dict(self.outcomes),
            "ms_p50": round(statistics.median(s) * 1000, 1) if s else None,
            "ms_p99": pct(0.99),
            "rss_mb_max": round(max(self.rss), 1) if self.rss else None,
            "rss_mb_last": round(self.rss[-1], 1) if self.rss else None,
        }


async def one_request(args: argparse.Namespace, port: int) -> tuple[str, float]:
    started = time.monotonic()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    ) + BODY
    try:
        async with asyncio.timeout(args.request_timeout):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(args.client_address, 0)
            )
            try:
                writer.write(request)
                answer = await reader.read()
            finally:
                writer.close()
    except TimeoutError:
        return "timeout", time.monotonic() - started
    except OSError as e:
        return type(e).__name__, time.monotonic() - started
    if not answer:
        return "closed without answer", time.monotonic() - started
    status = answer.split(b" ", 2)[1].decode(errors="replace")
    if status == "503":
        status = "503 evicted" if b"to make room" in answer else "503 connection limit"
    return status, time.monotonic() - started


async def clients(args: argparse.Namespace, port: int, phase_of: list[Phase]) -> None:
    async def loop() -> None:
        while True:
            phase = phase_of[0]
            outcome, seconds = await one_request(args, port)
            if phase is not phase_of[0]:
                continue  # began in the phase before: counted nowhere
            phase.outcomes[outcome] += 1
            if outcome == "200":
                phase.seconds.append(seconds)

    await asyncio.gather(*(loop() for _ in range(args.clients)))


async def counters(url: str) -> dict[str, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = (await reader.read()).decode(errors="replace")
    writer.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("fleet_proxy_client_connections_refused_total{"):
            name, value = line.rsplit(" ", 1)
            if float(value):
                out[name.split('"')[1]] = float(value)
    return out


async def sample_rss(pid: int, phase_of: list[Phase]) -> None:
    while True:
        if (mb := rss_mb(pid)) is not None:
            phase_of[0].rss.append(mb)
        await asyncio.sleep(0.5)


async def run_mode(args: argparse.Namespace, mode: str, url: str, proxy_pid: int) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    phases = [Phase("before"), Phase("during"), Phase("after")]
    phase_of = [phases[0]]
    before_counts = await counters(url)
    work = [
        asyncio.create_task(clients(args, port, phase_of)),
        asyncio.create_task(sample_rss(proxy_pid, phase_of)),
    ]
    flood_log = Path(args.out) / f"flood-{mode}.log"
    try:
        await asyncio.sleep(args.settle)
        phase_of[0] = phases[1]
        cmd = [sys.executable, __file__, "--flooder", "--mode", mode, "--port", str(port),
               "--sockets", str(args.sockets), "--seconds", str(args.seconds),
               "--flood-address", args.flood_address, "--dribble-every", str(args.dribble_every),
               "--reconnect-rate", str(args.reconnect_rate)]  # fmt: skip
        # It stops by itself after --seconds; the block's end stops it by PID if not.
        with process(cmd, flood_log) as flooder, contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(flooder.wait, args.seconds + 30)
        phase_of[0] = phases[2]
        await asyncio.sleep(args.settle)
    finally:
        for task in work:
            task.cancel()
        await asyncio.gather(*work, return_exceptions=True)
    after_counts = await counters(url)
    flood_lines = [json.loads(x) for x in flood_log.read_text().splitlines() if x.startswith("{")]
    return {
        "mode": mode,
        "phases": [p.row() for p in phases],
        "flood_open_max": max((x["open"] for x in flood_lines), default=0),
        "flood_connects": flood_lines[-1]["opened"] if flood_lines else 0,
        "proxy_refusals": {
            k: v - before_counts.get(k, 0)
            for k, v in after_counts.items()
            if v != before_counts.get(k)
        },
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"flood: {report['sockets']} sockets for {report['seconds']:g} s, {report['clients']} "
        f"clients, proxy settings {report['proxy_settings'] or 'default'}; load average "
        f"{report['load_average']}",
        "",
        "| mode | phase | requests | answered 200 | other outcomes | p50 / p99 ms | RSS max MB |",
        "|---|---|---:|---:|---|---|---:|",
    ]
    for m in report["modes"]:
        for p in m["phases"]:
            others = {k: v for k, v in p["outcomes"].items() if k != "200"}
            share = "-" if p["ok_share"] is None else f"{100 * p['ok_share']:.1f}%"
            lines.append(
                f"| {m['mode']} | {p['phase']} | {p['requests']} | {share} | {others or ''} "
                f"| {p['ms_p50']} / {p['ms_p99']} | {p['rss_mb_max']} |"
            )
    for m in report["modes"]:
        lines.append("")
        lines.append(
            f"{m['mode']}: flood sockets open at most {m['flood_open_max']}, connects "
            f"{m['flood_connects']}; proxy refusals {m['proxy_refusals']}"
        )
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    ports = free_ports(1)
    engine_port, proxy_port = ports
    py = sys.executable
    env = {"PYTHONPATH": str(ROOT)}
    for item in args.proxy_setting:
        key, _, value = item.partition("=")
        env[f"FLEET_PROXY_{key.upper()}"] = value
    out = Path(args.out)
    modes = MODES if args.mode == "all" else (args.mode,)
    with contextlib.ExitStack() as stack:
        sim = [py, "-m", "proxy.serving.cli", "sim", "--engines", "1", "--base-port",
               str(engine_port), "--speed", "100"]  # fmt: skip
        stack.enter_context(process(sim, out / "sim.log", env=env, own_session=True))
        engine = f"http://127.0.0.1:{engine_port}"
        await asyncio.to_thread(wait_http, engine + "/health")
        serve = [py, "-m", "proxy.serving.cli", "serve", "--port", str(proxy_port),
                 "--backend", engine, "--log-level", "warning"]  # fmt: skip
        proxy = stack.enter_context(process(serve, out / "proxy.log", env=env, own_session=True))
        url = f"http://127.0.0.1:{proxy_port}"
        await asyncio.to_thread(wait_http, url + "/ready", proc=proxy, log=out / "proxy.log")
        print(f"proxy {url} (pid {proxy.pid}), RSS {rss_mb(proxy.pid)} MB", flush=True)
        results = []
        for mode in modes:
            results.append(await run_mode(args, mode, url, proxy.pid))
            print(json.dumps(results[-1]), flush=True)
        return {
            "sockets": args.sockets,
            "seconds": args.seconds,
            "clients": args.clients,
            "proxy_settings": " ".join(args.proxy_setting),
            "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "modes": results,
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mode", default="idle", choices=(*MODES, "all"))
    p.add_argument("--sockets", type=int, default=10000, help="flood sockets (default 10000)")
    p.add_argument("--seconds", type=float, default=30.0, help="flood length (default 30)")
    p.add_argument("--clients", type=int, default=8, help="ordinary clients (default 8)")
    p.add_argument("--settle", type=float, default=5.0, help="seconds before and after a flood")
    p.add_argument("--request-timeout", type=float, default=10.0)
    p.add_argument("--dribble-every", type=float, default=3.0, help="seconds between body bytes")
    p.add_argument("--reconnect-rate", type=float, default=2000.0, help="flood connects a second")
    p.add_argument("--flood-address", default="127.0.0.1")
    p.add_argument("--client-address", default="127.0.0.2")
    p.add_argument("--proxy-setting", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--out", default="", help="results folder (default runs/flood-<time>)")
    p.add_argument("--flooder", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    args = p.parse_args()
    for address in (args.flood_address, args.client_address, args.host):
        if not address.startswith("127."):
            p.error(f"{address}: loopback (127.0.0.0/8) only")
    if args.flooder:
        flood_main(args)
        return
    limit = raise_open_files(args.sockets + args.clients + FD_SPARE)
    if limit < args.sockets + FD_SPARE:
        fit = max(1, limit - FD_SPARE)
        print(f"open-file hard limit {limit}: {fit} flood sockets, not {args.sockets}")
        args.sockets = fit
    args.out = args.out or str(ROOT / "runs" / time.strftime("flood-%Y%m%d-%H%M%S"))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    report = uvloop.run(main_async(args))
    report["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    (Path(args.out) / "results.json").write_text(json.dumps(report, indent=2))
    text = markdown(report)
    (Path(args.out) / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
