"""`fleet-proxy`: serve, demo, and the simulator and benchmark subcommands.

A command line answers at once: each subcommand imports what it needs when it runs, and only
the subcommand named gets its flags built (the settings model for `serve` and `reschedule`,
the planner for `plan`), so `fleet-proxy --help` imports none of them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.serving.setting_flags import (
    DISCOVERY_FLAGS,
    discovery_flags,
    fleet_flags,
    setting_flags,
)

if TYPE_CHECKING:
    from proxy.settings import Settings

# Every subcommand, in the order `fleet-proxy --help` lists them, with its line there.
SUBCOMMANDS = {
    "serve": "run the proxy in front of vLLM backends",
    "reschedule": "run the rescheduler on its own against a running proxy's admin API",
    "plan": "run the autoscaling planner against a running proxy (docs/planner.md)",
    "epp": "the endpoint picker of a Gateway API gateway, over Envoy's ext_proc",
    "demo": "a simulated vLLM fleet plus the proxy, in one command",
    "sim": "run simulated vLLM engines (see `fleet-proxy sim --help`)",
    "bench": "replay a workload against a base_url (`fleet-proxy bench -h`)",
    "profile-sla": "profile engines for the planner's SLA mode (`fleet-proxy profile-sla -h`)",
}


def _serve_parser(sub: Any) -> None:
    from proxy.serving.settings_help import settings_epilog

    p = sub.add_parser(
        "serve",
        help=SUBCOMMANDS["serve"],
        epilog=settings_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default 8000)")
    fleet_flags(p)
    p.add_argument("--admin-token", help="protect the /admin API with this token")
    p.add_argument(
        "--api-keys-file",
        type=Path,
        help="require a client key from this file (one per line) on the OpenAI endpoints",
    )
    p.add_argument(
        "--workers",
        type=int,
        help="serving processes sharing the port and their accounting (default 1)",
    )
    p.add_argument(
        "--enable-rescheduling",
        action="store_const",
        const=True,
        help="move live requests between backends (docs/rescheduler.md)",
    )
    _rescheduler_flags(p)
    p.add_argument(
        "--enable-planner",
        dest="planner_enabled",
        action="store_const",
        const=True,
        help="scale the fleet's workers with the planner in this process (docs/planner.md)",
    )
    setting_flags(p, PLANNER_FLAGS)
    discovery_flags(p)


# Every rescheduler setting has a flag of its own name (`--rescheduling-interval-ms 250`);
# values are validated with the settings, so a bad one is named the same way.
RESCHEDULER_FLAGS = (
    "rescheduling_policies",
    "rescheduling_interval_ms",
    "rescheduling_decode_load_metric",
    "rescheduling_decode_load_threshold",
    "rescheduling_neutral_load_metric",
    "rescheduling_neutral_load_threshold",
    "rescheduling_load_balance_threshold",
    "rescheduling_load_balance_scope",
    "failover_domain",
    "instance_staleness_seconds",
    "rescheduling_req_select_rule",
    "rescheduling_req_select_order",
    "rescheduling_req_select_value",
    "tpot_slo",
    "tpot_slo_dispatch_threshold",
    "tpot_migrate_out_ceil_threshold",
    "tpot_migrate_out_floor_threshold",
    "rescheduling_migration_timeout",
    "rescheduling_max_concurrent_migrations",
    "rescheduling_history",
)


# The colocated planner's settings, each a flag of its own name (`--planner-config plan.yaml`).
PLANNER_FLAGS = (
    "planner_config",
    "planner_prefill_command",
    "planner_decode_command",
    "planner_gpus",
    "planner_state_file",
    "planner_worker_log_dir",
    "planner_log_dir",
    "planner_start_timeout",
    "planner_drain_deadline",
    "planner_environment",
    "planner_namespace",
    "planner_served_model_name",
    "planner_prefill_target",
    "planner_decode_target",
    "planner_prefill_selector",
    "planner_decode_selector",
    "planner_engine_port",
    "planner_kubeconfig",
    "planner_register",
)


def _rescheduler_flags(p: Any) -> None:
    setting_flags(p, RESCHEDULER_FLAGS)


def _reschedule_parser(sub: Any) -> None:
    p = sub.add_parser("reschedule", help=SUBCOMMANDS["reschedule"])
    p.add_argument("--proxy", required=True, metavar="URL", help="the proxy's base URL")
    p.add_argument("--admin-token", help="the proxy's admin token")
    p.add_argument("--config", type=Path, help="YAML settings file (its rescheduling_* keys)")
    p.add_argument("--log-level", help="critical|error|warning|info|debug")
    p.add_argument(
        "--metrics-port", type=int, help="serve this process's metrics on 127.0.0.1:PORT"
    )
    _rescheduler_flags(p)


def _plan_parser(sub: Any) -> None:
    from planner.standalone import add_flags

    p = sub.add_parser("plan", help=SUBCOMMANDS["plan"])
    add_flags(p)


def _overrides(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


# The subcommands whose flags argparse parses, and what adds each one's.
_PARSERS: dict[str, Callable[[Any], None]] = {
    "serve": _serve_parser,
    "reschedule": _reschedule_parser,
    "plan": _plan_parser,
}


def build_settings(args: argparse.Namespace) -> Settings:
    from proxy.settings import load_settings

    names = [
        "host", "port", "backends", "policy", "admin_token", "api_keys_file", "log_level",
        "workers",
    ]  # fmt: skip
    overrides = _overrides(
        args,
        [
            *names,
            "enable_rescheduling",
            *RESCHEDULER_FLAGS,
            "planner_enabled",
            *PLANNER_FLAGS,
            "discovery_kubernetes",
            *DISCOVERY_FLAGS,
        ],
    )
    return load_settings(overrides, args.config)


def run_reschedule(args: argparse.Namespace) -> int:
    from fleet.log_setup import configure_logging
    from proxy.settings import ConfigError, load_settings
    from rescheduler.standalone import main as reschedule_main

    try:
        # The admin token is the proxy's, not a setting of this process.
        settings = load_settings(_overrides(args, ["log_level", *RESCHEDULER_FLAGS]), args.config)
    except ConfigError as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        return reschedule_main(settings, args.proxy, args.admin_token, args.metrics_port)
    except ValueError as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 2


def _version() -> str:
    from proxy.serving.version import installed_version

    return installed_version()


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked for: reading the installed metadata costs a
    noticeable part of a help command's time."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="show program's version number and exit",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """`fleet-proxy`'s parser with the flags of `command` (the subcommand on the line) only:
    the other subcommands are listed, their flags (and what those import) never built."""
    return _parsers(command)[0]


def _parsers(
    command: str | None,
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each subcommand's, by name."""
    parser = argparse.ArgumentParser(
        prog="fleet-proxy", description="OpenAI-compatible router for vLLM fleets"
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help in SUBCOMMANDS.items():
        add_parser = _PARSERS.get(name)
        if name == command and add_parser is not None:
            add_parser(sub)
        else:
            sub.add_parser(name, help=help)
    return parser, dict(sub.choices)


def parse_line(argv: list[str]) -> argparse.Namespace:
    """The command line parsed; an unknown flag is refused under its subcommand's usage (not
    the top-level one argparse would show) with the closest flags that subcommand has."""
    from proxy.serving.flag_suggestions import option_strings, refuse_unknown_flags, unrecognized

    parser, subcommands = _parsers(argv[0] if argv else None)
    chosen = subcommands.get(argv[0]) if argv else None
    if chosen is not None:
        refuse_unknown_flags(chosen, argv[1:])
    args, extras = parser.parse_known_args(argv)
    if extras:
        chosen = subcommands[args.command]
        chosen.error(unrecognized(extras, option_strings(chosen)))
    return args


Entry = Callable[[list[str]], int]


def own_parser(
    command: str, rest: list[str]
) -> tuple[argparse.ArgumentParser, list[str], Entry] | None:
    """For a subcommand that parses its own flags (the simulator, the benchmark, the SLA
    profiler, the demo): its parser, the words it parses, and its entry, which is handed the
    rest of the line untouched. None for the others, whose flags this module's parser holds."""
    if command == "sim":
        from simulator.cli import build_parser as build
        from simulator.cli import main as run
    elif command == "bench":
        from bench.cli import main as bench_main
        from bench.cli import parser_for

        parser, words = parser_for(rest)
        return parser, words, bench_main
    elif command == "profile-sla":
        from planner.profile_sla import build_parser as build
        from planner.profile_sla import main as run
    elif command == "epp":
        # Here only: grpc and Envoy's protos are loaded by this subcommand alone.
        from proxy.serving.epp_cli import build_parser as build
        from proxy.serving.epp_cli import main as run
    elif command == "demo":
        from proxy.serving.demo import build_parser as build
        from proxy.serving.demo import main as run
    else:
        return None
    return build(), rest, run


def subcommand_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser that reads the flags of the subcommand `argv` names (bench's own
    subcommands included)."""
    found = own_parser(argv[0], argv[1:])
    return found[0] if found is not None else _parsers(argv[0])[1][argv[0]]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = own_parser(argv[0], argv[1:]) if argv else None
    if found is not None:
        from proxy.serving.flag_suggestions import refuse_unknown_flags

        parser, words, run = found
        refuse_unknown_flags(parser, words)
        return run(argv[1:])

    args = parse_line(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "reschedule":
        return run_reschedule(args)
    if args.command == "plan":
        from planner.standalone import main as plan_main

        return plan_main(args)
    build_parser(None).print_help()
    return 2


def _serve(args: argparse.Namespace) -> int:
    from proxy.serving.serve import run_serve
    from proxy.settings import ConfigError

    try:
        settings = build_settings(args)
    except ConfigError as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 2
    return run_serve(settings)


if __name__ == "__main__":
    raise SystemExit(main())
