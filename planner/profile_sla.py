"""`fleet-proxy profile-sla`: profile engines for the planner's SLA mode (docs/planner.md).

Measures each parallel configuration (one running engine, `--url`, or each simulator profile,
`--sim`), chooses a configuration per role, prints the load-based planner thresholds it
suggests, and writes the SLA profile file and two plots.

Exit status: 0 when both SLAs are met; 1 when one is not (the file and plots are still
written, with the closest configuration chosen, so a script notices and a person can look);
2 on a bad flag or an engine that cannot be profiled, with one line saying why.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import NoReturn

from planner.profile_file import ConfigProfile, ProfileFile, SlaTarget, write_profile_file
from planner.sla_choice import CONTEXT_FACTORS, ISL_FACTORS, recommend, report_lines
from planner.sla_measure import EngineError, Plan, profile_engine, simulated_engine
from simulator.profiles import available_profiles, load_profile

PROG = "fleet-proxy profile-sla"


class _Parser(argparse.ArgumentParser):
    """Flag errors in one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: {message} (see --help)\n")


def _factors(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text}") from e
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"factors must be positive: {text}")
    return values


def _positive(kind: type[int] | type[float]) -> argparse._ActionType:
    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not a number: {text}") from e
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text}")
        return value

    return convert


def _csv(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


# Measuring effort and bounds: (flag, type, default, meaning).
_TUNING: tuple[tuple[str, type[int] | type[float], float | None, str], ...] = (
    ("--repeats", int, 3, "prefill timings per ISL, their median kept"),
    ("--decode-tokens", int, 64, "tokens each request of a decode run generates"),
    ("--max-in-flight", int, None, "most requests in flight to try"),
    ("--request-timeout", float, 300.0, "seconds a request, or a decode run, may take"),
)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Profile engines for the planner's SLA mode: TTFT over input length, ITL "
        "over requests in flight; choose a configuration per role and suggest thresholds.",
    )
    p.add_argument("--isl", type=_positive(int), required=True, help="target input length, tokens")
    p.add_argument("--osl", type=_positive(int), required=True, help="target output length, tokens")
    p.add_argument("--ttft", type=_positive(float), required=True, help="TTFT SLA, seconds")
    p.add_argument("--itl", type=_positive(float), required=True, help="ITL SLA, seconds")
    p.add_argument("--out", type=Path, default=Path("profile.json"), help="(default profile.json)")
    p.add_argument("--plots", type=Path, metavar="DIR", help="write the two PNG plots here")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--url", help="a running engine's base URL (one configuration)")
    which.add_argument(
        "--sim",
        nargs="*",
        metavar="PROFILE",
        help=f"simulated engines, one per profile (default all: {', '.join(available_profiles())})",
    )
    p.add_argument("--name", default="engine", help="--url's configuration name (default engine)")
    p.add_argument("--num-gpu", type=_positive(int), default=1, help="--url's GPUs (default 1)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("FLEET_PROXY_BACKEND_API_KEY"),
        help="--url's key, for an engine started with --api-key "
        "(default: FLEET_PROXY_BACKEND_API_KEY)",
    )
    p.add_argument(
        "--sim-speed",
        type=_positive(float),
        default=1.0,
        help="the simulator's clock speed; times are scaled back to engine seconds (default 1)",
    )
    p.add_argument(
        "--isl-factors",
        type=_factors,
        default=ISL_FACTORS,
        help=f"prefill sweep, times --isl (default {_csv(ISL_FACTORS)})",
    )
    p.add_argument(
        "--context-factors",
        type=_factors,
        default=CONTEXT_FACTORS,
        help=f"decode contexts, times ISL + OSL/2 (default {_csv(CONTEXT_FACTORS)})",
    )
    for flag, kind, default, meaning in _TUNING:
        shown = "what the KV cache holds" if default is None else f"{default:g}"
        p.add_argument(
            flag, type=_positive(kind), default=default, help=f"{meaning} (default {shown})"
        )
    return p


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _measure(args: argparse.Namespace, plan: Plan) -> list[ConfigProfile]:
    if args.url is not None:
        url = str(args.url).rstrip("/")
        return [await profile_engine(url, args.name, args.num_gpu, plan, _say, args.api_key)]
    out: list[ConfigProfile] = []
    for profile in args.sim or available_profiles():
        spec = load_profile(profile)
        name, max_len = spec.name, spec.max_model_len
        if plan.isl >= max_len:
            _say(f"{name}: skipped, ISL {plan.isl} does not fit its context of {max_len}")
            continue
        async with simulated_engine(profile, plan.time_scale) as url:
            _say(f"{name}: simulated at {url}")
            # A simulated engine stands for one GPU.
            out.append(await profile_engine(url, name, 1, plan, _say))
    if not out:
        raise EngineError("no simulator profile fits the target ISL")
    return out


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.plots is not None:
        try:
            import planner.sla_plots  # noqa: F401  (fail now, not after the measuring)
        except ImportError:
            _say(f"{PROG}: --plots needs matplotlib: pip install 'fleet-proxy[plots]'")
            return 2
    for profile in args.sim or ():
        try:
            load_profile(profile)
        except ValueError as e:
            _say(f"{PROG}: {e}")
            return 2
    plan = Plan(
        isl=args.isl,
        osl=args.osl,
        isl_factors=args.isl_factors,
        context_factors=args.context_factors,
        repeats=args.repeats,
        decode_tokens=args.decode_tokens,
        max_in_flight=args.max_in_flight,
        request_timeout_s=args.request_timeout,
        time_scale=args.sim_speed if args.url is None else 1.0,
    )
    sla = SlaTarget(isl=args.isl, osl=args.osl, ttft=args.ttft, itl=args.itl)
    try:
        configs = asyncio.run(_measure(args, plan))
    except EngineError as e:
        _say(f"{PROG}: {e}")
        return 2
    rec = recommend(sla, configs)
    data = ProfileFile(
        sla=sla,
        chosen_prefill=rec.prefill.config,
        chosen_decode=rec.decode.config,
        configs=tuple(configs),
    )
    write_profile_file(args.out, data)
    for line in report_lines(sla, rec):
        print(line)
    print(f"Profile written to {args.out}")
    if args.plots is not None:
        from planner.sla_plots import write_plots

        for path in write_plots(sla, configs, rec, args.plots):
            print(f"Plot written to {path}")
    return 0 if rec.prefill.meets and rec.decode.meets else 1
