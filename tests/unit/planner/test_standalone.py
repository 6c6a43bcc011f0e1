"""`fleet-proxy plan`'s settings: YAML file, flags over it, validation."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fleet.types import Role
from planner.config import PlannerMode, PlannerRole, PredictorKind, Topology
from planner.standalone import add_flags, build_config, build_local_settings, main


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p)
    return p.parse_args(["--proxy", "http://127.0.0.1:1", *argv])


def test_defaults_are_planner_config_defaults() -> None:
    config = build_config(parse())
    assert config.adjustment_interval == 30.0 and config.max_decode_replicas is None


def test_flags_override_file(tmp_path: Path) -> None:
    f = tmp_path / "plan.yaml"
    f.write_text("adjustment_interval: 10\nno_operation: true\nmax_decode_replicas: 4\n")
    config = build_config(parse("--config", str(f), "--adjustment-interval", "5"))
    assert config.adjustment_interval == 5.0
    assert config.no_operation is True and config.max_decode_replicas == 4


def test_bad_settings_refused(tmp_path: Path) -> None:
    f = tmp_path / "plan.yaml"
    f.write_text("adjustment_intervall: 10\n")
    with pytest.raises(ValueError, match="unknown planner settings"):
        build_config(parse("--config", str(f)))
    with pytest.raises(ValueError, match="adjustment_interval"):
        build_config(parse("--adjustment-interval", "0.1", "--metric-pulling-interval", "1"))


def test_aggregated_workers_register_as_both() -> None:
    args = parse("--topology", "aggregated", "--decode-command", "vllm serve m --port {port}")
    config = build_config(args)
    assert config.topology is Topology.AGGREGATED
    local = build_local_settings(args, config)
    assert local.backend_roles[PlannerRole.DECODE] is Role.BOTH
    assert local.commands[PlannerRole.DECODE] == ["vllm", "serve", "m", "--port", "{port}"]


def test_sla_settings_from_flags() -> None:
    config = build_config(
        parse(
            "--mode", "sla", "--ttft-target", "0.2", "--itl-target", "0.02",
            "--sla-profile", "sla.json", "--load-predictor", "kalman",
            "--load-predictor-window", "12",
        )
    )  # fmt: skip
    assert (config.mode, config.ttft_target, config.itl_target) == (PlannerMode.SLA, 0.2, 0.02)
    assert config.sla_profile == "sla.json"
    assert (config.load_predictor, config.load_predictor_window) == (PredictorKind.KALMAN, 12)


def test_log_dir_is_tensorboard_worker_output_has_its_own_flag(tmp_path: Path) -> None:
    args = parse("--log-dir", str(tmp_path / "tb"), "--worker-log-dir", str(tmp_path / "w"))
    assert args.log_dir == tmp_path / "tb"
    assert build_local_settings(args, build_config(args)).log_dir == tmp_path / "w"
    assert args.metrics_port is None and args.metrics_host == "127.0.0.1"
    assert parse("--metrics-port", "9100").metrics_port == 9100


def test_a_bad_sla_profile_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "sla.json"
    bad.write_text("{}")
    args = parse(
        "--mode", "sla", "--ttft-target", "0.2", "--itl-target", "0.02", "--sla-profile", str(bad)
    )  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fleet-proxy: ") and "sla.json" in err and "\n" not in err
