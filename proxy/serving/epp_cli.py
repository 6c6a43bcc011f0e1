"""`fleet-proxy epp`'s command line: the gRPC listener's own flags, and the fleet and routing
settings as `serve` takes them."""

from __future__ import annotations

import argparse
import asyncio
import sys

from fleet.log_setup import configure_logging
from proxy.gateway.objectives import FixedPriorities
from proxy.gateway.options import EppOptions
from proxy.gateway.shedding import Shedding
from proxy.serving.setting_flags import (
    DISCOVERY_FLAGS,
    discovery_flags,
    fleet_flags,
)


def build_parser() -> argparse.ArgumentParser:
    defaults = EppOptions()
    p = argparse.ArgumentParser(
        prog="fleet-proxy epp",
        description="the endpoint picker of a Gateway API gateway, over Envoy's ext_proc "
        "(docs/gateway.md)",
    )
    p.add_argument("--host", default=defaults.host, help=f"(default {defaults.host})")
    p.add_argument(
        "--port", type=int, default=defaults.port, help=f"gRPC port (default {defaults.port})"
    )
    fleet_flags(p)
    p.add_argument(
        "--fallbacks",
        type=int,
        default=defaults.fallbacks,
        help="engines named after the primary in the destination, for the gateway's retries "
        f"(default {defaults.fallbacks})",
    )
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on HOST:PORT (default off)"
    )
    p.add_argument(
        "--pool-name",
        help="find the engines as the pods of this InferencePool (its selector, its target "
        "port) (default none: --backend, or pod discovery's settings)",
    )
    p.add_argument(
        "--pool-poll-seconds",
        type=float,
        default=defaults.pool_poll_s,
        help="the InferencePool and its InferenceObjectives are watched; where the watch "
        "fails, seconds before they are listed again "
        f"(default {defaults.pool_poll_s:g})",
    )
    p.add_argument(
        "--pool-namespace",
        help="the InferencePool's namespace (default: --discovery-namespace, else the pod's own, "
        "else default)",
    )
    discovery_flags(p)
    shed = defaults.shedding
    p.add_argument(
        "--objective",
        action="append",
        default=[],
        metavar="NAME=PRIORITY",
        help="an objective's priority (the x-gateway-inference-objective header names it); "
        "a negative one is shed with 429 when every engine is saturated; repeat for each",
    )
    p.add_argument(
        "--saturation-queue-depth",
        type=float,
        default=shed.queue_depth,
        help=f"waiting requests at which an engine is saturated (default {shed.queue_depth:g})",
    )
    p.add_argument(
        "--saturation-kv-cache",
        type=float,
        default=shed.kv_cache,
        help=f"KV-cache usage (0..1) at which an engine is saturated (default {shed.kv_cache:g})",
    )
    return p


def parse_objectives(given: list[str]) -> dict[str, int]:
    """`NAME=PRIORITY` flags as a mapping; raises ValueError naming a bad one."""
    out: dict[str, int] = {}
    for item in given:
        name, sep, priority = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = int(priority)
        except ValueError:
            raise ValueError(f"--objective {item!r}: expected NAME=PRIORITY (an integer)") from None
    return out


def main(argv: list[str]) -> int:
    from proxy.serving.epp import serve_epp
    from proxy.settings import ConfigError, load_settings

    args = build_parser().parse_args(argv)
    if args.fallbacks < 0:
        print("fleet-proxy: --fallbacks must be 0 or more", file=sys.stderr)
        return 2
    if args.pool_poll_seconds <= 0:
        print("fleet-proxy: --pool-poll-seconds must be more than 0", file=sys.stderr)
        return 2
    try:
        priorities = parse_objectives(args.objective)
    except ValueError as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 2
    named = ["backends", "policy", "log_level", "discovery_kubernetes", *DISCOVERY_FLAGS]
    overrides = {n: getattr(args, n) for n in named if getattr(args, n) is not None}
    try:
        settings = load_settings(overrides, args.config)
    except ConfigError as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    shedding = Shedding(
        args.saturation_queue_depth, args.saturation_kv_cache, FixedPriorities(priorities)
    )
    options = EppOptions(
        args.host,
        args.port,
        args.fallbacks,
        args.metrics_port,
        shedding,
        args.pool_name,
        args.pool_namespace,
        args.pool_poll_seconds,
    )
    try:
        asyncio.run(serve_epp(settings, options))
    except (OSError, ValueError) as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 1
    return 0
