import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.settings import ConfigError, load_settings


def test_cli_overrides_env_overrides_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(
        "port: 7000\npolicy: round_robin\nscrape_interval: 0.5\n"
        "backends:\n  - url: http://10.0.0.1:8000/v1\n    role: prefill\n    labels: {zone: a}\n"
    )
    monkeypatch.setenv("FLEET_PROXY_SCRAPE_INTERVAL", "0.3")
    s = load_settings({"port": 9000}, cfg)
    assert s.port == 9000
    assert s.scrape_interval == 0.3
    assert s.policy == "round_robin"
    (spec,) = s.backend_specs()
    assert spec.url == "http://10.0.0.1:8000"
    assert spec.id == "10.0.0.1:8000"
    assert spec.role == "prefill" and spec.labels == {"zone": "a"}


def test_env_backends_as_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_PROXY_BACKENDS", '["http://127.0.0.1:1", "http://127.0.0.1:2"]')
    s = load_settings()
    assert [b.url for b in s.backends] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"port": 70000}, "port"),
        ({"scrape_interval": 0}, "scrape_interval"),
        ({"backends": ["localhost:8000"]}, "backends.0.url"),
        ({"backends": [{"url": "http://a:1", "role": "leader"}]}, "backends.0.role"),
        ({"log_level": "loud"}, "log_level"),
        ({"no_such_setting": 1}, "no_such_setting"),
        # The proxy connects to the engine's publisher; a wildcard host would bind.
        ({"backends": [{"url": "http://a:1", "kv_events_endpoint": "tcp://*:5557"}]},
         "backends.0.kv_events_endpoint"),
        ({"backends": [{"url": "http://a:1", "kv_events_endpoint": "a:5557"}]},
         "backends.0.kv_events_endpoint"),
        ({"backends": [{"url": "http://a:1", "kv_events_replay_endpoint": "tcp://a:5558"}]},
         "backends.0"),
    ],
)  # fmt: skip
def test_invalid_settings_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(overrides)
    assert f"  {field}:" in str(e.value)


def test_a_backends_kv_events_endpoints_reach_its_spec() -> None:
    s = load_settings(
        {
            "backends": [
                {
                    "url": "http://a:1",
                    "kv_events_endpoint": " tcp://a:5557",
                    "kv_events_replay_endpoint": "tcp://[fd00::1]:5558",
                },
                "http://b:1",
            ]
        }
    )
    a, b = s.backend_specs()
    assert (a.kv_events_endpoint, a.kv_events_replay_endpoint) == (
        "tcp://a:5557",
        "tcp://[fd00::1]:5558",
    )
    assert (b.kv_events_endpoint, b.kv_events_replay_endpoint) == ("", "")


def test_duplicate_backend_ids_are_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate backend id"):
        load_settings({"backends": ["http://a:1", "http://a:1/"]})


def test_a_configured_backend_id_with_a_slash_is_refused_at_startup() -> None:
    # The admin API could never drain, evacuate or remove it (its id is one path segment).
    backends = [{"url": "http://a:1", "id": "ns/pod-0"}]
    with pytest.raises(ConfigError, match="without spaces or '/'"):
        load_settings({"backends": backends})
    (spec,) = load_settings({"backends": [{"url": "http://a:1", "id": "pod-0.ns"}]}).backend_specs()
    assert spec.id == "pod-0.ns"


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings({}, Path("/nonexistent/fleet.yaml"))


def serve(*argv: str) -> subprocess.CompletedProcess[str]:
    """`fleet-proxy serve ARGV` in a fresh process, without this one's FLEET_PROXY_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_PROXY_")}
    return subprocess.run(
        [sys.executable, "-m", "proxy.serving.cli", "serve", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_serve_with_bad_settings_exits_2_naming_the_field() -> None:
    r = serve("--port", "99999")
    assert r.returncode == 2
    assert "port:" in r.stderr


def test_serve_with_unknown_policy_lists_known_ones() -> None:
    r = serve("--policy", "nope", "--port", "0")
    assert r.returncode == 2
    assert "unknown policy 'nope'" in r.stderr and "round_robin" in r.stderr


def test_hf_token_counting_needs_a_tokenizer_path() -> None:
    with pytest.raises(ConfigError, match="tokenizer_path"):
        load_settings({"token_counter": "hf"})


def test_max_connections_is_read_as_max_idle_connections_per_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("FLEET_PROXY_MAX_CONNECTIONS", raising=False)
    config = tmp_path / "proxy.yaml"
    config.write_text("max_connections: 64\n")
    with caplog.at_level("WARNING", logger="fleet_proxy.settings"):
        assert load_settings(config_file=config).max_idle_connections_per_backend == 64
    assert "'max_connections' is deprecated" in caplog.text
    both = {"max_connections": 64, "max_idle_connections_per_backend": 16}
    assert load_settings(both).max_idle_connections_per_backend == 16  # the new name wins
    monkeypatch.setenv("FLEET_PROXY_MAX_CONNECTIONS", "32")
    assert load_settings().max_idle_connections_per_backend == 32
    monkeypatch.delenv("FLEET_PROXY_MAX_CONNECTIONS")
    assert load_settings().max_idle_connections_per_backend == 2048
