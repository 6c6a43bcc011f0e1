"""The routing benchmarks' settings syntax (scripts/compare_peers.py): ROUTER:POLICY, and for
fleet-proxy +precise and @wN; the proxy command and YAML a setting gives; how a run's /metrics
are judged for using the precise index."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from proxy.settings import Settings
from tests.unit.bench.test_compare_peers import load_script


@pytest.fixture(scope="module")
def peers() -> ModuleType:
    return load_script()


@pytest.mark.parametrize(
    ("text", "policy", "workers", "precise", "params"),
    [
        ("fleet-proxy:unified", "unified", 1, False, {}),
        ("fleet-proxy:unified@w4", "unified", 4, False, {}),
        ("fleet-proxy:unified+precise", "unified", 1, True, {}),
        ("fleet-proxy:unified+precise@w2", "unified", 2, True, {}),
        ("fleet-proxy:unified/overload_factor=1.5", "unified", 1, False, {"overload_factor": 1.5}),
        (
            "fleet-proxy:unified/overload_factor=1.25/ceiling_factor=null+precise@w2",
            "unified",
            2,
            True,
            {"overload_factor": 1.25, "ceiling_factor": None},
        ),
        ("vllm-router:cache_aware", "cache_aware", 1, False, {}),
    ],
)
def test_a_setting_parses_and_its_label_is_its_text(
    peers: ModuleType, text: str, policy: str, workers: int, precise: bool, params: dict[str, Any]
) -> None:
    s = peers.RouterSetting.parse(text)
    assert (s.policy, s.workers, s.precise, dict(s.params)) == (policy, workers, precise, params)
    assert s.label == text
    assert "/" not in s.file_tag and ":" not in s.file_tag  # runs and logs are named by it


@pytest.mark.parametrize(
    "text",
    [
        "unified",
        "fleet-proxy:unified@4",
        "fleet-proxy:unified@w0",
        "fleet-proxy:unified@w",
        "fleet-proxy:unified@w2+precise",
        "fleet-proxy:unified+approx",
        "fleet-proxy:+precise",
        "vllm-router:cache_aware@w2",
        "sglang-router:cache_aware+precise",
        "vllm-router:cache_aware/x=1",
        "fleet-proxy:unified/overload_factor",
        "fleet-proxy:unified/=1",
        "fleet-proxy:/overload_factor=1",
    ],
)
def test_a_malformed_setting_is_refused(peers: ModuleType, text: str) -> None:
    with pytest.raises(ValueError, match="bad setting"):
        peers.RouterSetting.parse(text)


def test_workers_go_on_the_command_line_and_precise_in_a_config(
    peers: ModuleType, tmp_path: Path
) -> None:
    urls = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    plain = peers.RouterSetting.parse("fleet-proxy:unified@w2")
    cmd, ready = peers.router_command(plain, 8000, urls)
    assert cmd[cmd.index("--workers") + 1] == "2"
    assert cmd[cmd.index("--policy") + 1] == "unified" and "--config" not in cmd
    assert ready == "http://127.0.0.1:8000/ready"
    one = peers.router_command(peers.RouterSetting.parse("fleet-proxy:unified"), 8000, urls)[0]
    assert "--workers" not in one

    precise = peers.RouterSetting.parse("fleet-proxy:unified+precise@w2")
    log = tmp_path / "sim.log"
    log.write_text(
        "http://127.0.0.1:9001\nhttp://127.0.0.1:9002\n"
        "http://127.0.0.1:9001 publishes KV events on tcp://127.0.0.1:7001, "
        "replays on tcp://127.0.0.1:7002\n"
        "http://127.0.0.1:9002 publishes KV events on tcp://127.0.0.1:7003\n"
    )
    config = tmp_path / "proxy.yaml"
    data = peers.proxy_config(precise, urls, peers.kv_event_endpoints(log))
    config.write_text(yaml.safe_dump(data))
    assert yaml.safe_load(config.read_text()) == {
        "backends": [
            {
                "url": "http://127.0.0.1:9001",
                "kv_events_endpoint": "tcp://127.0.0.1:7001",
                "kv_events_replay_endpoint": "tcp://127.0.0.1:7002",
            },
            {"url": "http://127.0.0.1:9002", "kv_events_endpoint": "tcp://127.0.0.1:7003"},
        ],
        "routing": {"policy": "unified", "precise_prefix": {}},
    }
    # The proxy takes it as written.
    settings = Settings.model_validate(data)
    assert [b.kv_events_endpoint for b in settings.backends] == [
        "tcp://127.0.0.1:7001",
        "tcp://127.0.0.1:7003",
    ]
    cmd, _ = peers.router_command(precise, 8000, urls, config)
    assert cmd[cmd.index("--config") + 1] == str(config)
    assert "--backend" not in cmd and "--policy" not in cmd
    assert cmd[cmd.index("--workers") + 1] == "2"


def _metrics(events: int, blocks: int, precise: int, tokenized: int) -> str:
    rows = []
    for backend in ("a:1", "b:2"):
        rows += [
            f'fleet_proxy_kv_events_total{{backend="{backend}"}} {events}',
            f'fleet_proxy_kv_event_resyncs_total{{backend="{backend}",reason="gap"}} 0',
            f'fleet_proxy_kv_blocks_indexed{{backend="{backend}"}} {blocks}',
            f'fleet_proxy_kv_index_precise{{backend="{backend}"}} {precise}',
        ]
    rows += [
        f'fleet_proxy_kv_prompt_tokenize_total{{outcome="tokenized"}} {tokenized}',
        'fleet_proxy_kv_prompt_tokenize_total{outcome="cached"} 0',
    ]
    return "\n".join(rows) + "\n"


def test_a_run_counts_as_precise_only_when_the_index_was_fed_trusted_and_asked(
    peers: ModuleType,
) -> None:
    ok = peers.precise_index_state(_metrics(12, 80, 1, 5), 2)
    assert ok["problems"] == []
    assert ok["backends"]["a:1"]["blocks_indexed"] == 80
    assert ok["backends"]["a:1"]["event_resyncs_gap"] == 0
    assert ok["prompt_tokenize"] == {"tokenized": 5, "cached": 0}

    assert peers.precise_index_state(_metrics(12, 80, 1, 5), 3)["problems"] == [
        "2 of 3 backends subscribed"
    ]
    for bad, says in (
        (_metrics(0, 80, 1, 5), "no events applied"),
        (_metrics(12, 0, 1, 5), "no blocks indexed"),
        (_metrics(12, 80, 0, 5), "index not trusted"),
        (_metrics(12, 80, 1, 0), "no prompt tokenized"),
    ):
        assert any(says in p for p in peers.precise_index_state(bad, 2)["problems"])


def test_policy_parameters_go_in_a_config_the_proxy_takes(
    peers: ModuleType, tmp_path: Path
) -> None:
    urls = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    setting = peers.RouterSetting.parse("fleet-proxy:unified/overload_factor=1.5@w2")
    data = peers.proxy_config(setting, urls, {})
    assert data == {
        "backends": [{"url": u} for u in urls],
        "routing": {"policy": "unified", "params": {"overload_factor": 1.5}},
    }
    settings = Settings.model_validate(data)
    assert settings.routing == data["routing"]
    config = tmp_path / "proxy.yaml"
    config.write_text(yaml.safe_dump(data))
    cmd, _ = peers.router_command(setting, 8000, urls, config)
    assert cmd[cmd.index("--config") + 1] == str(config) and "--policy" not in cmd
