"""The `fleet-proxy plan` flags of the Kubernetes environment and the `KubernetesOptions` they
make."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.config import PlannerRole
from planner.connectors import Environment, KubernetesOptions
from planner.local import LocalSettings


def add_kubernetes_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--environment",
        choices=[e.value for e in Environment],
        default=Environment.LOCAL.value,
        help="where workers run: local processes or Kubernetes pods (default local)",
    )
    k = p.add_argument_group("Kubernetes workers (--environment kubernetes)")
    k.add_argument("--namespace", help="(default: the in-cluster namespace, else default)")
    k.add_argument(
        "--served-model-name",
        help="pod selectors default to fleet-proxy.io/model=NAME,fleet-proxy.io/role=ROLE",
    )
    for role in PlannerRole:
        k.add_argument(
            f"--{role.value}-target", metavar="KIND/NAME",
            help=f"what {role} scales: deployment/NAME or statefulset/NAME",
        )  # fmt: skip
        k.add_argument(f"--{role.value}-selector", help=f"label selector of the {role} pods")
    k.add_argument("--engine-port", type=int, default=8000, help="the pods' engine port (8000)")
    k.add_argument("--kubeconfig", type=Path, help="(default: in-cluster, else ~/.kube/config)")
    k.add_argument(
        "--no-register", dest="register", action="store_false",
        help="do not register new pods with the proxy (it discovers them itself)",
    )  # fmt: skip


def kubernetes_options(args: argparse.Namespace, local: LocalSettings) -> KubernetesOptions:
    """From the parsed flags; the start timeout and drain deadline are shared with local."""
    return KubernetesOptions(
        namespace=args.namespace,
        served_model_name=args.served_model_name,
        targets={r: t for r in PlannerRole if (t := getattr(args, f"{r.value}_target", None))},
        selectors={r: s for r in PlannerRole if (s := getattr(args, f"{r.value}_selector", None))},
        engine_port=args.engine_port,
        kubeconfig=args.kubeconfig,
        register=args.register,
        start_timeout_s=local.start_timeout_s,
        drain_deadline_s=local.drain_deadline_s,
    )
