"""The access-control settings: how keys and CORS lists are read, what is refused at start-up,
and what start-up warns about on a public listener."""

from pathlib import Path

import pytest

from proxy.serving.access import ClientKeys, RequireClientKey, client_keys
from proxy.serving.cli import build_settings, main
from proxy.serving.serve import exposure_warnings
from proxy.settings import ConfigError, load_settings


@pytest.mark.parametrize(
    "value", ['["k-1", "k-2"]', "k-1,k-2", " k-1 , k-2 ,"], ids=["json", "commas", "spaces"]
)
def test_api_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("FLEET_PROXY_API_KEYS", value)
    monkeypatch.setenv("FLEET_PROXY_CORS_ALLOW_ORIGINS", "https://a.example,https://b.example")
    s = load_settings()
    assert [k.get_secret_value() for k in s.api_keys] == ["k-1", "k-2"]
    assert s.cors_allow_origins == ["https://a.example", "https://b.example"]
    # Secret: never shown by the settings' repr (a log line, an error).
    assert "k-1" not in repr(s)


def test_api_keys_from_yaml(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("api_keys: [k-1, k-2]\nbackend_api_key: b-1\ncors_allow_origins: ['*']\n")
    s = load_settings(config_file=config)
    assert [k.get_secret_value() for k in s.api_keys] == ["k-1", "k-2"]
    assert s.backend_api_key is not None and s.backend_api_key.get_secret_value() == "b-1"
    assert s.cors_allow_origins == ["*"]


def test_defaults_leave_everything_open_and_local() -> None:
    s = load_settings()
    assert s.api_keys == [] and s.api_keys_file is None
    assert s.backend_api_key is None and s.forward_client_authorization is False
    assert s.cors_allow_origins == [] and s.cors_allow_credentials is False
    assert s.cors_allow_headers == ["*"] and s.cors_allow_methods == ["GET", "POST"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"api_keys": ["has space-secret"]}, "api_keys"),
        ({"api_keys": '["ok-secret", ""]'}, "api_keys"),
        ({"api_keys": "[not json-secret"}, "api_keys"),
        ({"backend_api_key": "line-secret\r\nX-Injected: 1"}, "backend_api_key"),
        (
            {"backend_api_key": "k-secret", "forward_client_authorization": True},
            "backend_api_key",
        ),
    ],
)
def test_unusable_keys_stop_start_up(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field) as e:
        load_settings(overrides)
    # The message names the field, never the key itself.
    assert "secret" not in str(e.value)


def test_client_keys_compare_the_bearer_value() -> None:
    keys = ClientKeys(["k-1", "k-2"])
    assert keys.allows("Bearer k-1") and keys.allows("bearer k-2") and keys.allows("BEARER k-1")
    for refused in (None, "", "k-1", "Basic k-1", "Bearer k-1x", "Bearer k", "Bearer "):
        assert not keys.allows(refused), refused
    assert keys.refusal(None).message != keys.refusal("Bearer x").message
    with pytest.raises(ValueError):
        ClientKeys([])


def test_the_forwarders_authorization_refuses_a_request_without_an_accepted_key() -> None:
    authorize = RequireClientKey(ClientKeys(["k-1"]))
    assert authorize({"authorization": "Bearer k-1", "content-type": "application/json"}) is None
    missing = authorize({"content-type": "application/json"})
    wrong = authorize({"authorization": "Bearer k-2"})
    assert missing is not None and wrong is not None
    assert (missing.status, missing.code, wrong.status, wrong.code) == (
        401,
        "invalid_api_key",
        401,
        "invalid_api_key",
    )
    assert (
        missing.message.startswith("no API key") and wrong.message == "incorrect API key provided"
    )


def test_serve_flag_names_the_keys_file(tmp_path: Path) -> None:
    import argparse

    args = argparse.Namespace(api_keys_file=tmp_path / "k", config=None)
    assert build_settings(args).api_keys_file == tmp_path / "k"


def test_serve_with_a_missing_keys_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "keys.txt"
    assert main(["serve", "--port", "0", "--api-keys-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "no such file" in err


def test_public_listeners_warn_about_admin_and_keys() -> None:
    assert exposure_warnings(load_settings({"host": "127.0.0.1"})) == []
    assert exposure_warnings(load_settings({"host": "localhost"})) == []
    open_ = exposure_warnings(load_settings({"host": "0.0.0.0"}))
    assert any("admin API is off" in w and "admin_token" in w for w in open_)
    assert any("no api_keys" in w for w in open_)
    closed = exposure_warnings(
        load_settings({"host": "0.0.0.0", "admin_token": "t", "api_keys": ["k"]})
    )
    assert closed == []


def test_a_key_may_name_its_tenant_in_the_settings_and_the_keys_file(tmp_path: Path) -> None:
    s = load_settings({"api_keys": ["plain-key", {"key": "team-key", "tenant": "team-a"}]})
    assert s.client_keys() == [("plain-key", None), ("team-key", "team-a")]
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("file-key tenant=team-b  # a comment\nother-key\n")
    keys = client_keys(s.client_keys(), keys_file)
    assert keys is not None
    assert keys.allows("Bearer team-key") and keys.allows("Bearer file-key")
    assert keys.tenant("Bearer team-key") == "team-a"
    assert keys.tenant("Bearer file-key") == "team-b"
    assert keys.tenant("Bearer plain-key") is None
    assert keys.tenant("Bearer other-key") is None
    assert keys.tenant(None) is None


def test_api_keys_with_tenants_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_PROXY_API_KEYS", '["k-1", {"key": "k-2", "tenant": "t"}]')
    assert load_settings({}).client_keys() == [("k-1", None), ("k-2", "t")]


def test_a_keys_file_line_naming_no_tenant_stops_start_up(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("good-key\nother-key tenant=\n")
    with pytest.raises(ValueError, match="line 2: `tenant=` names no tenant"):
        client_keys([], keys_file)
