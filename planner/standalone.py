"""`fleet-proxy plan --proxy URL`: the planner on its own, driving a running proxy through its
admin API, with workers as local processes (`LocalConnector`).

Settings: `PlannerConfig`'s fields, from a YAML file (`--config`, its keys the field names)
and flags of the same names (`--adjustment-interval 10`), flags winning.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from pathlib import Path

import httpx
import yaml
from prometheus_client import CollectorRegistry

from fleet.log_setup import configure_logging
from planner.assemble import build_planner, local_settings, observers
from planner.config import PlannerConfig, PlannerRole
from planner.config_file import config_fields, load_config
from planner.connectors import Environment, build_connector, kubernetes_settings
from planner.kube_flags import add_kubernetes_flags, kubernetes_options
from planner.local import LocalSettings
from planner.proxy_admin import HttpProxyAdmin, admin_client
from planner.sla_mode import decider_for
from planner.status_server import serving_status

log = logging.getLogger("fleet_proxy.planner")


class ProxyUnreachable(Exception):
    """The planner's first call to the proxy's admin API failed: it has nothing to plan."""


def unreachable(proxy: str, e: httpx.HTTPError) -> str:
    """One line saying why the proxy did not answer the planner, and what to do."""
    if isinstance(e, httpx.HTTPStatusError):
        status = e.response.status_code
        hint = "pass its --admin-token" if status in (401, 403) else "is it fleet-proxy?"
        return f"the proxy at {proxy} answered its admin API with {status}: {hint}"
    return (
        f"cannot reach the proxy at {proxy} ({type(e).__name__}: {e}): start it first "
        "(`fleet-proxy serve`) or point --proxy at it"
    )


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--proxy", required=True, metavar="URL", help="the proxy's base URL")
    p.add_argument("--admin-token", help="the proxy's admin token")
    p.add_argument("--config", type=Path, help="YAML file of planner settings")
    p.add_argument("--log-level", default="info", help="critical|error|warning|info|debug")
    p.add_argument("--log-dir", type=Path, help="write TensorBoard event files here")
    p.add_argument(
        "--metrics-port", type=int, help="serve /metrics and /status on this port (default: off)"
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    g = p.add_argument_group("planner settings")
    for f in config_fields():
        g.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, metavar="V", help=f"(default {f.default})"
        )
    w = p.add_argument_group("local workers")
    for role in PlannerRole:
        w.add_argument(
            f"--{role.value}-command",
            metavar="CMD",
            help=f"{role} worker command, with {{port}} and {{role}} (default: the simulator)",
        )
    w.add_argument("--gpus", help="GPU ids to hand out, comma-separated (default: none)")
    w.add_argument("--state-file", type=Path, default=Path("fleet-planner-state.json"))
    w.add_argument("--worker-log-dir", type=Path, help="write each worker's output here")
    w.add_argument("--start-timeout", type=float, default=600.0, help="seconds to /health")
    w.add_argument("--drain-deadline", type=float, default=120.0, help="seconds to drain")
    add_kubernetes_flags(p)


def build_config(args: argparse.Namespace) -> PlannerConfig:
    overrides = {f.name: getattr(args, f.name, None) for f in config_fields()}
    return load_config(args.config, overrides)


def build_local_settings(args: argparse.Namespace, config: PlannerConfig) -> LocalSettings:
    return local_settings(
        config,
        commands={role: getattr(args, f"{role.value}_command", None) for role in PlannerRole},
        gpus=args.gpus,
        state_file=args.state_file,
        worker_log_dir=args.worker_log_dir,
        start_timeout_s=args.start_timeout,
        drain_deadline_s=args.drain_deadline,
    )


async def run(args: argparse.Namespace, config: PlannerConfig, local: LocalSettings) -> None:
    registry = CollectorRegistry(auto_describe=True)
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(admin_client(args.admin_token))
        proxy = HttpProxyAdmin(client, args.proxy)
        watching = observers(registry, args.log_dir)
        stack.callback(watching.close)
        connector = await stack.enter_async_context(
            build_connector(
                Environment(args.environment),
                proxy,
                config,
                local=local,
                kubernetes=kubernetes_options(args, local),
                events=watching.for_connector,
            )
        )
        planner = build_planner(proxy, connector, config, watching)
        if args.metrics_port is not None:
            port = await stack.enter_async_context(
                serving_status(planner.status, registry, args.metrics_host, args.metrics_port)
            )
            log.info("planner /metrics and /status on %s:%d", args.metrics_host, port)
        loop = planner.loop
        try:
            state = await loop.start()
        except httpx.HTTPError as e:  # the first call to the proxy: nothing planned yet
            raise ProxyUnreachable(unreachable(args.proxy, e)) from e
        log.info(
            "planning %s: prefill=%d decode=%d, adjusting every %.1fs",
            args.proxy, state.prefill_replicas, state.decode_replicas, config.adjustment_interval,
        )  # fmt: skip
        await loop.run()


def main(args: argparse.Namespace) -> int:
    configure_logging(str(args.log_level))
    try:
        config = build_config(args)
        local = build_local_settings(args, config)
        decider_for(config)  # an SLA profile's or predictor's faults, before starting
        if args.environment == Environment.KUBERNETES:  # its flags' faults before starting
            kubernetes_settings(kubernetes_options(args, local), config)
    except (ValueError, OSError, yaml.YAMLError) as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 2
    # Workers outlive the planner on purpose: a restarted one finds them in the state file.
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run(args, config, local))
    except ProxyUnreachable as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 1
    return 0
