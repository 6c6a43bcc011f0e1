from pathlib import Path

import pytest

from proxy.serving.cli import build_settings
from proxy.settings import ConfigError, load_settings
from rescheduler.config import FailoverDomain, ReschedulerConfig, Scope, SelectOrder, SelectRule


def test_defaults_build_the_default_config() -> None:
    s = load_settings({})
    assert s.enable_rescheduling is False and s.rescheduling_interval_ms == 500
    assert s.rescheduler_config() == ReschedulerConfig()
    assert s.rescheduling_migration_timeout == 5.0
    assert s.rescheduling_max_concurrent_migrations == 10


def test_every_value_reaches_the_config() -> None:
    s = load_settings({
        "rescheduling_policies": "neutral_load,neutral_failover",
        "rescheduling_neutral_load_metric": "num_requests",
        "rescheduling_neutral_load_threshold": "0.5",
        "rescheduling_load_balance_scope": "unit",
        "failover_domain": "node",
        "instance_staleness_seconds": 7,
        "rescheduling_req_select_rule": "NUM_REQ",
        "rescheduling_req_select_order": "FCW",
        "rescheduling_req_select_value": 3,
        "tpot_slo": 80,
    })  # fmt: skip
    c = s.rescheduler_config()
    assert c.policies == ("neutral_load", "neutral_failover")
    assert (c.neutral_load_metric, c.neutral_load_threshold) == ("num_requests", 0.5)
    assert c.load_balance_scope is Scope.UNIT and c.failover_domain is FailoverDomain.NODE
    assert c.req_select_rule is SelectRule.NUM_REQ and c.req_select_order is SelectOrder.FCW
    assert c.instance_staleness_s == 7 and c.req_select_value == 3 and c.tpot_slo_s == 0.08


def test_a_yaml_list_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("rescheduling_policies: [decode_load, binpacking_mitigation]\n")
    assert load_settings({}, f).rescheduling_policies == ["decode_load", "binpacking_mitigation"]
    monkeypatch.setenv("FLEET_PROXY_RESCHEDULING_POLICIES", "neutral_load, decode_failover")
    monkeypatch.setenv("FLEET_PROXY_ENABLE_RESCHEDULING", "true")
    s = load_settings({})
    assert s.rescheduling_policies == ["neutral_load", "decode_failover"]
    assert s.enable_rescheduling


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rescheduling_policies": "decode_load,fastest"}, "unknown rescheduling policy 'fastest'"),
        ({"rescheduling_policies": "decode_load,decode_load"}, "twice"),
        ({"rescheduling_decode_load_metric": "vibes"}, "known: kv_cache_usage_ratio_projected"),
        ({"failover_domain": "rack"}, "failover_domain"),
        ({"rescheduling_req_select_order": "XX"}, "rescheduling_req_select_order"),
        ({"rescheduling_interval_ms": 0}, "rescheduling_interval_ms"),
        ({"rescheduling_max_concurrent_migrations": 0}, "max_concurrent"),
        ({"tpot_migrate_out_floor_threshold": 0.99}, "must not exceed"),
        ({"rescheduling_req_select_rule": "RATIO", "rescheduling_req_select_value": 5}, "RATIO"),
    ],
)
def test_bad_values_are_named(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(overrides)


def test_the_unknown_policy_error_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as e:
        load_settings({"rescheduling_policies": "nope"})
    assert "known: decode_load, neutral_load, prefill_failover" in str(e.value)


def test_with_workers_amounts_are_split_between_them() -> None:
    tokens = load_settings({"rescheduling_req_select_value": 1024})
    assert tokens.rescheduler_config(workers=4).req_select_value == 256
    few = load_settings(
        {"rescheduling_req_select_rule": "NUM_REQ", "rescheduling_req_select_value": 3}
    )
    assert few.rescheduler_config(workers=2).req_select_value == 2  # at least one each, rounded up
    assert few.rescheduler_config(workers=8).req_select_value == 1


def test_cli_flags() -> None:
    import argparse

    from proxy.serving.cli import _serve_parser

    parser = argparse.ArgumentParser()
    _serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--enable-rescheduling", "--rescheduling-interval-ms", "250",
                              "--rescheduling-policies", "neutral_load", "--failover-domain",
                              "node-unit"])  # fmt: skip
    args.config = None
    s = build_settings(args)
    assert s.enable_rescheduling and s.rescheduling_interval_ms == 250
    assert s.rescheduling_policies == ["neutral_load"]
    assert s.failover_domain is FailoverDomain.NODE_UNIT
