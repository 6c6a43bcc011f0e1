"""Soak: N concurrent streams through the proxy for M minutes while engines fail on a schedule.

Starts `fleet-proxy sim` (--engines engines) and `fleet-proxy serve` in front of them as child
processes on free loopback ports. Each of --streams clients loops for --minutes: send a
streamed chat or completions request (`ignore_eos`, so every answer has exactly --tokens
tokens), read it to the end, check it. Faults are applied to engines on a schedule through
their admin endpoint (docs/simulator.md). Reports, per --window seconds and in total:

- requests completed, and client-visible errors by kind (HTTP status, error event, stream
  without [DONE], transport error, client timeout, wrong usage, text that differs from the
  answer an unfaulted engine gives: duplicated when longer, missing when a prefix);
- lost tokens: tokens asked minus tokens received, over requests that ended (0 when every
  answer is whole);
- the proxy's resident memory (VmRSS of its process) over time;
- the proxy's migration, retry, upstream error and ejection counters from its /metrics.

    python scripts/soak.py --streams 256 --minutes 10 --engines 4
    python scripts/soak.py --streams 64 --minutes 1 --schedule "kill:1@25%+15,hang:2@50%+15"

--schedule is a comma-separated list of FAULT:ENGINE@START[+SECONDS], or "none". FAULT is
kill (crash; back as a fresh engine after SECONDS), hang, stall (stall_generation), errors
(every request answered 500), cut (each stream cut halfway) or slow (steps 4x longer); START
is seconds into the run ("90s") or a share of it ("25%"); SECONDS undoes the fault after that
long (without it the fault lasts to the end). Default: "kill:1@25%+60,hang:2@50%+60".

Everything runs on 127.0.0.1. No request starts after --minutes; those still running get up to
--grace seconds to end, then are counted as cut off. The child processes are stopped by PID
on every exit, Ctrl-C included. Results: runs/soak-<time>/results.json and summary.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from localproc import ROOT, free_ports, process  # scripts/ is on sys.path

MODEL = "sim-llama-8b"
PATHS = ("/v1/chat/completions", "/v1/completions")
PROMPTS = 32
DEFAULT_SCHEDULE = "kill:1@25%+60,hang:2@50%+60"
_LEGS = b": x-fleet-legs "
# Counters worth following from the proxy's /metrics (names, whatever their labels).
_COUNTER = re.compile(
    r"^(fleet_proxy_\w*(migrations|retries|upstream_errors|eject)\w*_total)(\{[^}]*\})? (\S+)$"
)


# ---- the fault schedule ---------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    engine: int
    start_s: float
    duration_s: float | None

    def label(self) -> str:
        until = f" for {self.duration_s:g} s" if self.duration_s is not None else ""
        return f"{self.kind} engine {self.engine} at {self.start_s:g} s{until}"

    def apply(self, tokens: int) -> dict[str, Any]:
        if self.kind == "kill":
            return {"crash": True, "recover_after_s": self.duration_s}
        bodies: dict[str, dict[str, Any]] = {
            "hang": {"hang": True},
            "stall": {"stall_generation": True},
            "errors": {"error_rate": 1.0},
            "cut": {"cut_stream_after_tokens": max(1, tokens // 2)},
            "slow": {"slowdown": 4.0},
        }
        return bodies[self.kind]

    def undo(self) -> dict[str, Any] | None:
        return {
            "kill": None,  # the engine comes back by itself (recover_after_s)
            "hang": {"hang": False},
            "stall": {"stall_generation": False},
            "errors": {"error_rate": 0.0},
            "cut": {"cut_stream_after_tokens": None},
            "slow": {"slowdown": 1.0},
        }[self.kind]


_EVENT = re.compile(r"^(\w+):(\d+)@(\d+(?:\.\d+)?)(%|s?)(?:\+(\d+(?:\.\d+)?)s?)?$")
_KINDS = ("kill", "hang", "stall", "errors", "cut", "slow")


def parse_schedule(spec: str, run_s: float, engines: int) -> list[Fault]:
    if spec.strip().lower() in ("", "none"):
        return []
    out = []
    for item in spec.split(","):
        m = _EVENT.match(item.strip())
        if m is None:
            raise ValueError(f"bad schedule entry {item!r}: want FAULT:ENGINE@START[+SECONDS]")
        kind, engine, at, unit, dur = m.groups()
        if kind not in _KINDS:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(_KINDS)}")
        if int(engine) >= engines:
            raise ValueError(f"{item!r}: there are only {engines} engines (0-{engines - 1})")
        start = float(at) / 100 * run_s if unit == "%" else float(at)
        out.append(Fault(kind, int(engine), start, float(dur) if dur else None))
    return sorted(out, key=lambda f: f.start_s)


# ---- what the clients see ---------------------------------------------------------------------


@dataclass
class Reference:
    text: str
    ends: list[int]  # the text's length after each token


@dataclass
class Outcome:
    ended: float  # seconds into the run
    error: str = ""  # kind of client-visible failure, "" when none
    detail: str = ""
    received: int = 0  # tokens the client got
    legs: int = 1  # backends that served it (from the proxy's x-fleet-legs note)
    duplicated: bool = False
    seconds: float = 0.0  # from sending to the end of the answer


def tokens_in(ref: Reference, text: str) -> int:
    """Tokens of the reference whose text `text` holds whole (text is a prefix of it)."""
    n = 0
    for end in ref.ends:
        if end > len(text):
            break
        n += 1
    return n


def check_text(ref: Reference, text: str, out: Outcome) -> None:
    if text == ref.text:
        out.received = len(ref.ends)
    elif ref.text.startswith(text):
        out.received = tokens_in(ref, text)
        if not out.error:
            out.error, out.detail = "missing_text", f"{len(text)} of {len(ref.text)} chars"
    else:
        # Text the reference does not have: a repeat after a move, or a garbled splice.
        out.duplicated = len(text) > len(ref.text)
        common = 0
        while common < min(len(text), len(ref.text)) and text[common] == ref.text[common]:
            common += 1
        out.received = tokens_in(ref, text[:common])
        if not out.error:
            out.error = "duplicated_text" if out.duplicated else "wrong_text"
            out.detail = f"differs from char {common}: {text[common : common + 60]!r}"


async def one_request(
    http: aiohttp.ClientSession,
    url: str,
    path: str,
    prompt: int,
    tokens: int,
    ref: Reference,
    t0: float,
) -> Outcome:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if path == "/v1/completions":
        body["prompt"] = prompt_text(prompt)
    else:
        body["messages"] = [{"role": "user", "content": prompt_text(prompt)}]
    out = Outcome(ended=0.0)
    sent = time.monotonic()
    parts: list[str] = []
    dones = 0
    usage: int | None = None
    try:
        async with http.post(url + path, json=body, headers={"x-fleet-debug": "1"}) as r:
            if r.status != 200:
                out.error, out.detail = f"http_{r.status}", (await r.text())[:200]
            else:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        event = orjson.loads(line[6:])
                        if "error" in event:
                            out.error, out.detail = "error_event", str(event["error"])[:200]
                            continue
                        for c in event.get("choices") or ():
                            parts.append(
                                c.get("text") or (c.get("delta") or {}).get("content") or ""
                            )
                        if event.get("usage"):
                            usage = event["usage"]["completion_tokens"]
                    elif line.startswith(b"data: [DONE]"):
                        dones += 1
                    elif line.startswith(_LEGS):
                        out.legs = len(orjson.loads(line[len(_LEGS) :]))
    except TimeoutError:
        out.error = "client_timeout"
    except aiohttp.ClientError as e:
        out.error, out.detail = f"transport_{type(e).__name__}", str(e)[:200]
    now = time.monotonic()
    out.ended, out.seconds = now - t0, now - sent
    if not out.error and dones != 1:
        out.error, out.detail = "no_done" if dones == 0 else "repeated_done", f"{dones} [DONE]"
    check_text(ref, "".join(parts), out)
    if not out.error and usage != tokens:
        out.error, out.detail = "wrong_usage", f"completion_tokens {usage}, asked {tokens}"
    return out


def prompt_text(i: int) -> str:
    return f"Soak prompt {i}: describe the lighthouse keeper's long night, hour by hour."


async def references(url: str, tokens: int) -> dict[tuple[str, int], Reference]:
    """Every (endpoint, prompt)'s answer from one engine before any fault, with the text length
    after each token (the simulator's output depends on the prompt alone)."""
    from simulator.tokenizer import Tokenizer

    tok = Tokenizer()
    out: dict[tuple[str, int], Reference] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:

        async def one(path: str, i: int) -> None:
            body: dict[str, Any] = {
                "model": MODEL,
                "max_tokens": tokens,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            if path == "/v1/completions":
                body["prompt"] = prompt_text(i)
            else:
                body["messages"] = [{"role": "user", "content": prompt_text(i)}]
            async with http.post(url + path, json=body) as r:
                choice = (await r.json())["choices"][0]
            text = choice.get("text") or choice["message"]["content"]
            ends, n = [], 0
            for t in choice["token_ids"]:
                n += len(tok.token_str(t))
                ends.append(n)
            if n != len(text) or len(ends) != tokens:
                raise RuntimeError(f"reference for {path} #{i} does not add up")
            out[(path, i)] = Reference(text, ends)

        await asyncio.gather(*(one(p, i) for p in PATHS for i in range(PROMPTS)))
    return out


# ---- the proxy, seen from outside -------------------------------------------------------------


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


async def proxy_counters(http: aiohttp.ClientSession, url: str) -> dict[str, float] | None:
    try:
        async with http.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _COUNTER.match(line)
        if m is not None:
            out[m.group(1) + (m.group(3) or "")] = float(m.group(4))
    return out


async def wait_ok(url: str, limit: float = 60.0) -> None:
    """Until `url` answers 200 (async, so that Ctrl-C does not wait for it)."""
    deadline = time.monotonic() + limit
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(url) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} never answered 200")


# ---- the run ----------------------------------------------------------------------------------


@dataclass
class Window:
    start_s: float
    completed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    asked_tokens: int = 0
    received_tokens: int = 0
    duplicated: int = 0
    moved: int = 0  # requests served by more than one backend
    seconds: list[float] = field(default_factory=list)  # each request's duration
    rss_mb: list[float] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)  # deltas over the window
    faults: list[str] = field(default_factory=list)

    def add(self, o: Outcome, tokens: int) -> None:
        if o.error:
            self.errors[o.error] += 1
        else:
            self.completed += 1
        self.asked_tokens += tokens
        self.received_tokens += o.received
        self.duplicated += o.duplicated
        self.moved += o.legs > 1
        self.seconds.append(o.seconds)

    def row(self) -> dict[str, Any]:
        return {
            "start_s": self.start_s,
            "completed": self.completed,
            "errors": dict(self.errors),
            "lost_tokens": self.asked_tokens - self.received_tokens,
            "received_tokens": self.received_tokens,
            "duplicated_text": self.duplicated,
            "moved": self.moved,
            **latency(self.seconds),
            "rss_mb_max": max(self.rss_mb, default=None),
            "rss_mb_last": self.rss_mb[-1] if self.rss_mb else None,
            "counters": self.counters,
            "faults": self.faults,
        }


def latency(seconds: list[float]) -> dict[str, float | None]:
    """Request durations: a request stuck on a silent backend shows here first."""
    if not seconds:
        return {"seconds_p50": None, "seconds_p99": None, "seconds_max": None}
    ordered = sorted(seconds)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"seconds_p50": at(0.5), "seconds_p99": at(0.99), "seconds_max": round(ordered[-1], 3)}


class Soak:
    def __init__(self, args: argparse.Namespace, url: str, engines: list[str], pid: int) -> None:
        self.args = args
        self.url = url
        self.engines = engines
        self.pid = pid
        self.run_s = args.minutes * 60
        self.windows: list[Window] = []
        self.samples: list[dict[str, Any]] = []
        self.fault_log: list[dict[str, Any]] = []
        self.error_samples: dict[str, list[str]] = {}
        self.cut_off = 0
        self.t0 = 0.0
        self.counters_start: dict[str, float] = {}
        self.counters_last: dict[str, float] = {}

    def window(self, t: float) -> Window:
        i = max(0, int(t // self.args.window))
        while len(self.windows) <= i:
            self.windows.append(Window(len(self.windows) * self.args.window))
        return self.windows[i]

    def record(self, o: Outcome) -> None:
        self.window(o.ended).add(o, self.args.tokens)
        if o.error:
            samples = self.error_samples.setdefault(o.error, [])
            if len(samples) < 5:
                samples.append(f"{o.ended:.1f} s: {o.detail}")

    async def client(
        self, http: aiohttp.ClientSession, i: int, refs: dict[tuple[str, int], Reference]
    ) -> None:
        await asyncio.sleep(i / max(1, self.args.streams) * 2)  # spread the first requests
        n = 0
        while time.monotonic() - self.t0 < self.run_s:
            path, prompt = PATHS[(i + n) % 2], (i * 7 + n) % PROMPTS
            o = await one_request(
                http, self.url, path, prompt, self.args.tokens, refs[(path, prompt)], self.t0
            )
            self.record(o)
            n += 1

    async def faults(self, http: aiohttp.ClientSession, schedule: list[Fault]) -> None:
        async def post(engine: int, body: dict[str, Any], what: str) -> None:
            entry: dict[str, Any] = {"t_s": round(time.monotonic() - self.t0, 2), "what": what}
            try:
                async with http.post(
                    self.engines[engine] + "/_sim/faults",
                    json=body,
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as r:
                    entry["status"] = r.status
            except (aiohttp.ClientError, TimeoutError) as e:
                entry["status"] = f"{type(e).__name__}: {e}"
            self.fault_log.append(entry)
            self.window(entry["t_s"]).faults.append(what)
            print(f"[{entry['t_s']:7.1f} s] {what}: {entry['status']}", flush=True)

        async def one(f: Fault) -> None:
            await asyncio.sleep(max(0.0, self.t0 + f.start_s - time.monotonic()))
            await post(f.engine, f.apply(self.args.tokens), f"{f.kind} engine {f.engine}")
            undo = f.undo()
            if f.duration_s is None:
                return
            await asyncio.sleep(max(0.0, self.t0 + f.start_s + f.duration_s - time.monotonic()))
            if undo is not None:
                await post(f.engine, undo, f"end {f.kind} engine {f.engine}")
            else:
                self.fault_log.append(
                    {"t_s": round(f.start_s + f.duration_s, 2), "what": f"engine {f.engine} back"}
                )

        await asyncio.gather(*(one(f) for f in schedule if f.start_s < self.run_s))

    async def monitor(self, http: aiohttp.ClientSession) -> None:
        """Proxy RSS every second; its counters at every window's end."""
        next_window = self.args.window
        while True:
            await asyncio.sleep(1.0)
            t = time.monotonic() - self.t0
            rss = rss_mb(self.pid)
            if rss is not None:
                self.window(t).rss_mb.append(rss)
                self.samples.append({"t_s": round(t, 1), "rss_mb": round(rss, 1)})
            if t >= next_window:
                await self.close_window(http, next_window - self.args.window)
                next_window += self.args.window

    async def close_window(self, http: aiohttp.ClientSession, start: float) -> None:
        counters = await proxy_counters(http, self.url)
        if counters is None:
            return
        w = self.window(start)
        w.counters = {
            k: v - self.counters_last.get(k, 0.0)
            for k, v in counters.items()
            if v != self.counters_last.get(k, 0.0)
        }
        self.counters_last = counters
        done = sum(x.completed for x in self.windows)
        errors = sum(sum(x.errors.values()) for x in self.windows)
        print(
            f"[{start + self.args.window:7.1f} s] completed {w.completed}, errors "
            f"{dict(w.errors) or 0}, lost tokens {w.asked_tokens - w.received_tokens}, moved "
            f"{w.moved}, slowest {max(w.seconds, default=0):.1f} s, "
            f"proxy RSS {max(w.rss_mb, default=0):.0f} MB "
            f"(total {done} ok, {errors} errors)",
            flush=True,
        )

    async def run(self, refs: dict[tuple[str, int], Reference], schedule: list[Fault]) -> bool:
        """Drive the load; False when interrupted (Ctrl-C, SIGTERM)."""
        args = self.args
        connector = aiohttp.TCPConnector(limit=args.streams + 8)
        timeout = aiohttp.ClientTimeout(total=args.request_timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            self.counters_start = self.counters_last = await proxy_counters(http, self.url) or {}
            self.t0 = time.monotonic()
            monitor = asyncio.create_task(self.monitor(http))
            faults = asyncio.create_task(self.faults(http, schedule))
            clients = [asyncio.create_task(self.client(http, i, refs)) for i in range(args.streams)]
            finished = True
            try:
                # No request starts after the run's end; running ones get the grace period.
                await asyncio.wait(clients, timeout=self.run_s + args.grace)
            except asyncio.CancelledError:
                # Ctrl-C or SIGTERM: stop the load, then still report what was seen.
                finished = False
                me = asyncio.current_task()
                if me is not None:
                    me.uncancel()
            self.cut_off = sum(not c.done() for c in clients)
            for task in (*clients, monitor, faults):
                task.cancel()
            await asyncio.gather(*clients, monitor, faults, return_exceptions=True)
            t = time.monotonic() - self.t0
            await self.close_window(http, self.window(t).start_s)
        return finished

    def report(self, finished: bool) -> dict[str, Any]:
        args = self.args
        total = Window(0.0)
        for w in self.windows:
            total.completed += w.completed
            total.errors.update(w.errors)
            total.asked_tokens += w.asked_tokens
            total.received_tokens += w.received_tokens
            total.duplicated += w.duplicated
            total.moved += w.moved
            total.seconds.extend(w.seconds)
            total.rss_mb.extend(w.rss_mb)
        counters = {
            k: v - self.counters_start.get(k, 0.0)
            for k, v in self.counters_last.items()
            if v != self.counters_start.get(k, 0.0)
        }
        rss = total.rss_mb
        return {
            "config": {
                "streams": args.streams,
                "minutes": args.minutes,
                "engines": args.engines,
                "tokens": args.tokens,
                "speed": args.speed,
                "profile": args.profile,
                "policy": args.policy,
                "window_s": args.window,
                "schedule": args.schedule,
                "proxy_settings": args.proxy_setting,
                "engine_urls": self.engines,
            },
            "finished": finished,
            "totals": {
                "requests_ended": total.completed + sum(total.errors.values()),
                "completed": total.completed,
                "client_errors": sum(total.errors.values()),
                "errors_by_kind": dict(total.errors),
                "lost_tokens": total.asked_tokens - total.received_tokens,
                "received_tokens": total.received_tokens,
                "duplicated_text": total.duplicated,
                "moved": total.moved,
                **latency(total.seconds),
                "cut_off_at_end": self.cut_off,
                "rss_mb_first": rss[0] if rss else None,
                "rss_mb_max": max(rss, default=None),
                "rss_mb_last": rss[-1] if rss else None,
                "proxy_counters": counters,
            },
            "faults": self.fault_log,
            "error_samples": self.error_samples,
            "windows": [w.row() for w in self.windows],
            "rss_samples": self.samples,
        }


def summary_md(report: dict[str, Any]) -> str:
    c, t = report["config"], report["totals"]

    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    lines = [
        f"# Soak: {c['streams']} streams, {c['minutes']:g} min, {c['engines']} engines",
        "",
        f"Schedule `{c['schedule']}`, {c['tokens']} tokens a request, speed {c['speed']:g}, "
        f"policy {c['policy']}"
        + (f", proxy settings {' '.join(c['proxy_settings'])}" if c["proxy_settings"] else "")
        + ("" if report["finished"] else " (interrupted)"),
        "",
        "| | total |",
        "|---|---:|",
        f"| requests ended | {t['requests_ended']} |",
        f"| completed whole | {t['completed']} |",
        f"| client-visible errors | {t['client_errors']} {t['errors_by_kind'] or ''} |",
        f"| lost tokens | {t['lost_tokens']} |",
        f"| duplicated text | {t['duplicated_text']} |",
        f"| served by 2+ backends | {t['moved']} |",
        f"| request seconds p50 / p99 / max | {t['seconds_p50']} / {t['seconds_p99']} "
        f"/ {t['seconds_max']} |",
        f"| still running at the end | {t['cut_off_at_end']} |",
        f"| proxy RSS first / max / last (MB) | {mb(t['rss_mb_first'])} / {mb(t['rss_mb_max'])} "
        f"/ {mb(t['rss_mb_last'])} |",
        "",
        "Engines (backend ids in the counters): "
        + ", ".join(f"{i} = {u.removeprefix('http://')}" for i, u in enumerate(c["engine_urls"])),
        "",
        "Proxy counters over the run:",
        "",
        *(f"- `{k}` {v:g}" for k, v in sorted(t["proxy_counters"].items())),
        "",
        "Faults:",
        "",
        *(
            f"- {f['t_s']:.1f} s: {f['what']}" + (f" ({f['status']})" if "status" in f else "")
            for f in report["faults"]
        ),
        "",
        "Per window (by the time each request ended): requests completed whole, client-visible",
        "errors, lost tokens, requests the client saw served by 2+ backends, request durations,",
        "and the proxy's counted moves (outcome ok), retries and passive ejections:",
        "",
        "| window (s) | completed | errors | lost tokens | moved | seconds p99 / max "
        "| proxy moves / retries / ejections | RSS max (MB) | faults |",
        "|---:|---:|---|---:|---:|---|---|---:|---|",
    ]
    for w in report["windows"]:
        moves, retries, ejections = (
            sum(v for k, v in w["counters"].items() if k.startswith(prefix))
            for prefix in (
                'fleet_proxy_migrations_total{outcome="ok"',
                "fleet_proxy_retries_total",
                "fleet_proxy_passive_ejections_total",
            )
        )
        lines.append(
            f"| {w['start_s']:g} | {w['completed']} | {w['errors'] or ''} | {w['lost_tokens']} "
            f"| {w['moved']} | {w['seconds_p99']} / {w['seconds_max']} "
            f"| {moves:g} / {retries:g} / {ejections:g} | {mb(w['rss_mb_max'])} "
            f"| {', '.join(w['faults'])} |"
        )
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    ports = free_ports(args.engines)
    engine_ports, proxy_port = ports[: args.engines], ports[args.engines]
    engines = [f"http://127.0.0.1:{p}" for p in engine_ports]
    schedule = parse_schedule(args.schedule, args.minutes * 60, args.engines)
    py = sys.executable
    # The legs note (x-fleet-debug) tells moved streams from the others.
    env = {"FLEET_PROXY_DEBUG_RECEIPTS": "true"}
    for item in args.proxy_setting:
        key, _, value = item.partition("=")
        env[f"FLEET_PROXY_{key.upper()}"] = value
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    stopping: list[int] = []

    def stop(sig: int) -> None:
        # Once: a second signal (`timeout` sends one to the process and one to its group)
        # would cut short the report the first one lets the run write.
        if not stopping:
            stopping.append(sig)
            main_task.cancel()

    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop, sig)
    with contextlib.ExitStack() as stack:
        sim_cmd = [py, "-m", "proxy.serving.cli", "sim", "--engines", str(args.engines),
                   "--base-port", str(engine_ports[0]), "--speed", str(args.speed),
                   "--profile", args.profile]  # fmt: skip
        stack.enter_context(process(sim_cmd, out_dir / "sim.log", own_session=True))
        for url in engines:
            await wait_ok(url + "/health")
        cmd = [py, "-m", "proxy.serving.cli", "serve", "--port", str(proxy_port), "--policy",
               args.policy, "--log-level", "warning"]  # fmt: skip
        for url in engines:
            cmd += ["--backend", url]
        proxy = stack.enter_context(process(cmd, out_dir / "proxy.log", env=env, own_session=True))
        url = f"http://127.0.0.1:{proxy_port}"
        await wait_ok(url + "/ready")
        refs = await references(engines[0], args.tokens)
        print(f"proxy {url} (pid {proxy.pid}), engines {', '.join(engines)}", flush=True)
        for f in schedule:
            print(f"scheduled: {f.label()}", flush=True)
        soak = Soak(args, url, engines, proxy.pid)
        finished = await soak.run(refs, schedule)
        return soak.report(finished)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--streams", type=int, default=256, help="concurrent clients (default 256)")
    p.add_argument("--minutes", type=float, default=10.0, help="run length (default 10)")
    p.add_argument("--engines", type=int, default=4, help="simulated engines (default 4)")
    p.add_argument("--tokens", type=int, default=128, help="max_tokens of every request")
    p.add_argument("--schedule", default=DEFAULT_SCHEDULE, help="faults (see above)")
    p.add_argument("--speed", type=float, default=1.0, help="the engines' clock speed")
    p.add_argument("--profile", default="h100-llama-8b", help="simulator profile")
    p.add_argument("--policy", default="least_requests", help="the proxy's routing policy")
    p.add_argument("--window", type=float, default=10.0, help="report window in seconds")
    p.add_argument(
        "--request-timeout", type=float, default=120.0, help="a client's wait for one answer"
    )
    p.add_argument(
        "--grace", type=float, default=30.0, help="seconds running requests get after the end"
    )
    p.add_argument(
        "--proxy-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a proxy setting (FLEET_PROXY_<NAME>), e.g. stall_timeout=2; repeatable",
    )
    args = p.parse_args()
    if args.streams < 1 or args.engines < 1 or args.minutes <= 0 or args.window <= 0:
        p.error("--streams, --engines, --minutes and --window must be positive")
    try:
        parse_schedule(args.schedule, args.minutes * 60, args.engines)
    except ValueError as e:
        p.error(str(e))
    out_dir = ROOT / "runs" / time.strftime("soak-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = asyncio.run(main_async(args, out_dir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; child processes stopped, no report written", file=sys.stderr)
        raise SystemExit(130) from None
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
    (out_dir / "summary.md").write_text(summary_md(report))
    t = report["totals"]
    print(
        f"\n{t['requests_ended']} requests ended: {t['completed']} whole, {t['client_errors']} "
        f"errors {t['errors_by_kind'] or ''}, lost tokens {t['lost_tokens']}, duplicated text "
        f"{t['duplicated_text']}, moved {t['moved']}, cut off at the end {t['cut_off_at_end']}, "
        f"request seconds p50 {t['seconds_p50']} p99 {t['seconds_p99']} max {t['seconds_max']}; "
        f"proxy RSS {t['rss_mb_first'] or 0:.0f} MB first, {t['rss_mb_max'] or 0:.0f} MB max"
    )
    print(f"proxy counters: {t['proxy_counters']}")
    print(f"wrote {out_dir / 'results.json'} and summary.md")
    if not report["finished"]:
        raise SystemExit(130)


if __name__ == "__main__":
    main()
