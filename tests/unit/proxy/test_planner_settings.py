"""The colocated planner's settings: defaults, flags, the planner file, and the refusal with
several serving processes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from planner.config import PlannerRole, Topology
from planner.config_file import load_config
from planner.connectors import Environment, kubernetes_settings
from planner.kubernetes import default_selector
from proxy.serving.app import create_app
from proxy.serving.cli import _serve_parser, build_settings
from proxy.settings import ConfigError, load_settings
from tests.unit.proxy.test_settings_and_cli import serve


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _serve_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_defaults() -> None:
    s = load_settings()
    assert s.planner_enabled is False
    assert s.planner_config is None and s.planner_log_dir is None
    assert s.planner_prefill_command is None and s.planner_decode_command is None
    assert s.planner_gpus is None and s.planner_worker_log_dir is None
    assert s.planner_state_file == Path("fleet-planner-state.json")
    assert (s.planner_start_timeout, s.planner_drain_deadline) == (600.0, 120.0)


def test_flags(tmp_path: Path) -> None:
    s = build_settings(
        serve_args(
            "--enable-planner",
            "--planner-config",
            str(tmp_path / "plan.yaml"),
            "--planner-decode-command",
            "vllm serve m --port {port}",
            "--planner-gpus",
            "0,1",
            "--planner-state-file",
            str(tmp_path / "state.json"),
            "--planner-worker-log-dir",
            str(tmp_path / "w"),
            "--planner-log-dir",
            str(tmp_path / "tb"),
            "--planner-start-timeout",
            "30",
            "--planner-drain-deadline",
            "15",
        )
    )
    assert s.planner_enabled is True
    assert s.planner_config == tmp_path / "plan.yaml"
    assert s.planner_decode_command == "vllm serve m --port {port}"
    assert s.planner_gpus == "0,1"
    assert s.planner_state_file == tmp_path / "state.json"
    assert s.planner_worker_log_dir == tmp_path / "w" and s.planner_log_dir == tmp_path / "tb"
    assert (s.planner_start_timeout, s.planner_drain_deadline) == (30.0, 15.0)
    assert build_settings(serve_args()).planner_enabled is False


def test_planner_file_read_with_the_standalone_keys(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("topology: aggregated\nadjustment_interval: 7\nmax_decode_replicas: 3\n")
    s = load_settings(
        {
            "planner_enabled": True,
            "planner_config": plan,
            "planner_gpus": "2, 3",
            "planner_state_file": tmp_path / "state.json",
        }
    )
    planner = create_app(s).control_app.state.planner
    config = planner.config
    assert config.topology is Topology.AGGREGATED and config.adjustment_interval == 7.0
    assert config.max_decode_replicas == 3
    assert list(planner.local.gpus) == ["2", "3"]
    assert planner.environment is Environment.LOCAL
    assert planner.status() == {"running": False, "environment": "local"}


def test_kubernetes_settings_reach_the_connector_options(tmp_path: Path) -> None:
    s = load_settings(
        {
            "planner_enabled": True,
            "planner_environment": "kubernetes",
            "planner_namespace": "llm",
            "planner_served_model_name": "m",
            "planner_prefill_target": "deployment/pre",
            "planner_decode_target": "statefulset/dec",
            "planner_decode_selector": "app=dec",
            "planner_engine_port": 8080,
            "planner_register": "false",
            "planner_state_file": tmp_path / "state.json",
        }
    )
    k = create_app(s).control_app.state.planner.kubernetes
    assert (k.namespace, k.engine_port, k.register) == ("llm", 8080, False)
    assert dict(k.targets) == {
        PlannerRole.PREFILL: "deployment/pre",
        PlannerRole.DECODE: "statefulset/dec",
    }
    assert dict(k.selectors) == {PlannerRole.DECODE: "app=dec"}
    settings = kubernetes_settings(k, load_config(None))
    assert settings.roles[PlannerRole.PREFILL].selector == default_selector(
        "m", PlannerRole.PREFILL
    )


def test_kubernetes_without_a_target_stops_start_up_naming_the_setting(tmp_path: Path) -> None:
    s = load_settings(
        {
            "planner_enabled": True,
            "planner_environment": "kubernetes",
            "planner_served_model_name": "m",
            "planner_decode_target": "deployment/dec",
            "planner_state_file": tmp_path / "state.json",
        }
    )
    with pytest.raises(ValueError, match="planner_prefill_target is needed"):
        create_app(s)
    with pytest.raises(ConfigError, match="planner_environment"):
        load_settings({"planner_environment": "cloud"})


def test_bad_planner_file_stops_start_up(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("adjustment_intervall: 7\n")
    s = load_settings({"planner_enabled": True, "planner_config": plan})
    with pytest.raises(ValueError, match="unknown planner settings"):
        create_app(s)
    s = load_settings({"planner_enabled": True, "planner_config": tmp_path / "none.yaml"})
    with pytest.raises(ValueError, match="planner_config"):
        create_app(s)


def test_refused_with_several_workers() -> None:
    with pytest.raises(ConfigError, match="fleet-proxy plan"):
        load_settings({"planner_enabled": True, "workers": 2})
    assert load_settings({"planner_enabled": True, "workers": 1}).planner_enabled


def test_serve_refuses_planner_with_workers_exits_2() -> None:
    r = serve("--enable-planner", "--workers", "2")
    assert r.returncode == 2
    assert "planner_enabled needs workers = 1" in r.stderr and "fleet-proxy plan" in r.stderr
