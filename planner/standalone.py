"""`fleet-proxy plan --proxy URL`: the planner on its own, driving a running proxy through its
admin API, with workers as local processes (`LocalConnector`).

Settings: `PlannerConfig`'s fields, from a YAML file (`--config`, its keys the field names)
and flags of the same names (`--adjustment-interval 10`), flags winning.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import shlex
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from fleet.types import Role
from planner.admin import HttpProxyAdmin, admin_client
from planner.config import PlannerConfig, PlannerRole, Topology, check_config
from planner.connectors import Environment, build_connector, kubernetes_settings
from planner.kube_flags import add_kubernetes_flags, kubernetes_options
from planner.local import LocalSettings
from planner.loop import PlannerLoop

log = logging.getLogger("fleet_proxy.planner")


def config_fields() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(PlannerConfig))


def _convert(name: str, raw: Any) -> Any:
    """A flag's or YAML value as the field's type."""
    hint = typing.get_type_hints(PlannerConfig)[name]
    if isinstance(hint, types.UnionType):  # `int | None`
        if raw is None or str(raw).lower() in ("none", ""):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() in ("1", "true", "yes", "on"):
            return True
        if str(raw).lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}: not a boolean: {raw!r}")
    if hint is Topology:
        return Topology(str(raw))
    return hint(raw)


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--proxy", required=True, metavar="URL", help="the proxy's base URL")
    p.add_argument("--admin-token", help="the proxy's admin token")
    p.add_argument("--config", type=Path, help="YAML file of planner settings")
    p.add_argument("--log-level", default="info", help="critical|error|warning|info|debug")
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
    w.add_argument("--log-dir", type=Path, help="write each worker's output here")
    w.add_argument("--start-timeout", type=float, default=600.0, help="seconds to /health")
    w.add_argument("--drain-deadline", type=float, default=120.0, help="seconds to drain")
    add_kubernetes_flags(p)


def build_config(args: argparse.Namespace) -> PlannerConfig:
    values: dict[str, Any] = {}
    names = {f.name for f in config_fields()}
    if args.config is not None:
        data = yaml.safe_load(args.config.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{args.config}: a mapping of planner settings expected")
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{args.config}: unknown planner settings {unknown}")
        values.update({k: _convert(k, v) for k, v in data.items()})
    for name in names:
        raw = getattr(args, name, None)
        if raw is not None:
            values[name] = _convert(name, raw)
    config = PlannerConfig(**values)
    check_config(config)
    return config


def build_local_settings(args: argparse.Namespace, config: PlannerConfig) -> LocalSettings:
    commands = {
        role: shlex.split(cmd)
        for role in PlannerRole
        if (cmd := getattr(args, f"{role.value}_command", None))
    }
    backend_roles = {PlannerRole.PREFILL: Role.PREFILL, PlannerRole.DECODE: Role.DECODE}
    if len(config.roles) == 1:  # aggregated: the workers prefill and decode
        backend_roles[PlannerRole.DECODE] = Role.BOTH
    return LocalSettings(
        commands=commands,
        backend_roles=backend_roles,
        gpus=[g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else [],
        engine_num_gpu={role: config.engine_gpus(role) for role in PlannerRole},
        state_file=args.state_file,
        log_dir=args.log_dir,
        start_timeout_s=args.start_timeout,
        drain_deadline_s=args.drain_deadline,
    )


async def run(args: argparse.Namespace, config: PlannerConfig, local: LocalSettings) -> None:
    async with admin_client(args.admin_token) as client:
        proxy = HttpProxyAdmin(client, args.proxy)
        async with build_connector(
            Environment(args.environment), proxy, config,
            local=local, kubernetes=kubernetes_options(args, local),
        ) as connector:  # fmt: skip
            loop = PlannerLoop(proxy, connector, config)
            state = await loop.start()
            log.info(
                "planning %s: prefill=%d decode=%d, adjusting every %.1fs",
                args.proxy, state.prefill_replicas, state.decode_replicas,
                config.adjustment_interval,
            )  # fmt: skip
            await loop.run()


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = build_config(args)
        local = build_local_settings(args, config)
        if args.environment == Environment.KUBERNETES:  # its flags' faults before starting
            kubernetes_settings(kubernetes_options(args, local), config)
    except (ValueError, OSError, yaml.YAMLError) as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 2
    # Workers outlive the planner on purpose: a restarted one finds them in the state file.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args, config, local))
    return 0
