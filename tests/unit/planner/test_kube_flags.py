"""`fleet-proxy plan --environment kubernetes`: its flags, their defaults, and the connector
`build_connector` makes of them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fleet.kube import ScaleKind, ScaleTarget
from fleet.types import Role
from planner.config import PlannerConfig, PlannerRole, Topology
from planner.connectors import (
    Environment,
    KubernetesOptions,
    build_connector,
    kubernetes_settings,
)
from planner.kube_flags import kubernetes_options
from planner.kubernetes import KubernetesConnector, KubeRole
from planner.local import LocalConnector, LocalSettings
from planner.standalone import add_flags, build_config, build_local_settings, main
from tests.unit.planner.fake_admin import FakeAdmin


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p)
    return p.parse_args(["--proxy", "http://127.0.0.1:1", *argv])


def options(args: argparse.Namespace) -> KubernetesOptions:
    return kubernetes_options(args, build_local_settings(args, build_config(args)))


def test_defaults() -> None:
    args = parse()
    assert args.environment == "local"
    o = options(args)
    assert (o.namespace, o.served_model_name, o.engine_port, o.kubeconfig, o.register) == (
        None, None, 8000, None, True,
    )  # fmt: skip
    assert o.targets == {} and o.selectors == {}
    assert o.start_timeout_s == 600.0 and o.drain_deadline_s == 120.0


def test_served_model_name_makes_the_default_selectors() -> None:
    args = parse("--environment", "kubernetes", "--namespace", "llm", "--served-model-name",
                 "llama", "--prefill-target", "deployment/p", "--decode-target",
                 "statefulset/d", "--engine-port", "9000", "--no-register",
                 "--kubeconfig", "/k.yaml")  # fmt: skip
    s = kubernetes_settings(options(args), build_config(args))
    assert s.namespace == "llm" and s.engine_port == 9000 and s.register is False
    assert s.roles[PlannerRole.PREFILL] == KubeRole(
        ScaleTarget(ScaleKind.DEPLOYMENT, "p"),
        "fleet-proxy.io/model=llama,fleet-proxy.io/role=prefill",
    )
    assert s.roles[PlannerRole.DECODE].target.kind is ScaleKind.STATEFULSET
    assert options(args).kubeconfig == Path("/k.yaml")


def test_selectors_win_and_aggregated_plans_decode_only() -> None:
    args = parse("--topology", "aggregated", "--decode-target", "deployment/d",
                 "--decode-selector", "app=d", "--served-model-name", "m")  # fmt: skip
    s = kubernetes_settings(options(args), build_config(args))
    assert list(s.roles) == [PlannerRole.DECODE]
    assert s.roles[PlannerRole.DECODE].selector == "app=d"
    assert s.backend_roles[PlannerRole.DECODE] is Role.BOTH
    assert s.namespace == "default"  # outside a cluster


def test_missing_target_or_selector_refused(capsys: pytest.CaptureFixture[str]) -> None:
    config = PlannerConfig(topology=Topology.AGGREGATED)
    with pytest.raises(ValueError, match="--decode-target"):
        kubernetes_settings(KubernetesOptions(), config)
    with pytest.raises(ValueError, match="--served-model-name"):
        kubernetes_settings(KubernetesOptions(targets={PlannerRole.DECODE: "deployment/d"}), config)
    with pytest.raises(ValueError, match="deployment/NAME"):
        kubernetes_settings(
            KubernetesOptions(targets={PlannerRole.DECODE: "pod/d"}, served_model_name="m"), config
        )
    assert main(parse("--environment", "kubernetes")) == 2
    assert "--prefill-target" in capsys.readouterr().err


async def test_build_connector_per_environment() -> None:
    config = PlannerConfig(topology=Topology.AGGREGATED)
    async with build_connector(Environment.LOCAL, FakeAdmin(), config, local=LocalSettings()) as c:
        assert isinstance(c, LocalConnector)
    kube = KubernetesOptions(
        targets={PlannerRole.DECODE: "deployment/d"},
        served_model_name="m",
        base_url="http://127.0.0.1:1",
    )
    async with build_connector(Environment.KUBERNETES, FakeAdmin(), config, kubernetes=kube) as c:
        assert isinstance(c, KubernetesConnector)
        assert c.settings.roles[PlannerRole.DECODE].target == ScaleTarget.parse("deployment/d")
