"""The Kubernetes manifests under deploy/kubernetes, checked without an API server: every document
parses, selectors match the labels they select, probes and RBAC are what the docs say, the
proxy's environment is valid settings, the example engine pods are what discovery picks, the
images are pinned and not pulled when present, the proxy runs unprivileged, and the pods'
metrics are annotated for Prometheus."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.inference_pool import pool_target
from fleet.kube import PodInfo
from fleet.pod_backends import backend_from_pod
from fleet.types import Role
from proxy.serving.epp_cli import build_parser as build_epp_parser
from proxy.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy" / "kubernetes"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d is not None]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def test_every_file_holds_the_kinds_it_should() -> None:
    kinds = {p.name: sorted(d["kind"] for d in documents(p.name)) for p in DEPLOY.glob("*.yaml")}
    assert kinds == {
        "proxy.yaml": ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"],
        "planner-rbac.yaml": ["Role", "RoleBinding"],
        "vllm.yaml": ["Deployment"],
        "gateway.yaml": [
            "Deployment",
            "HTTPRoute",
            "InferencePool",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ],
    }


@pytest.mark.parametrize("name", ["proxy.yaml", "vllm.yaml", "gateway.yaml"])
def test_deployment_selectors_match_their_pod_labels(name: str) -> None:
    deployment = one(documents(name), "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector and selector.items() <= labels.items()


def test_the_service_selects_the_proxy_pods_on_the_proxy_port() -> None:
    docs = documents("proxy.yaml")
    service, deployment = one(docs, "Service"), one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"] for p in container(deployment)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


def test_proxy_probes_are_health_and_ready() -> None:
    c = container(one(documents("proxy.yaml"), "Deployment"))
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    ports = {p["name"] for p in c["ports"]}
    assert {c["livenessProbe"]["httpGet"]["port"], c["readinessProbe"]["httpGet"]["port"]} <= ports


def test_rbac_grants_exactly_what_is_read_and_the_planner_exactly_what_it_changes() -> None:
    proxy = documents("proxy.yaml")
    assert rules(one(proxy, "Role")) == {("", "pods", v) for v in ("get", "list", "watch")}
    planner = one(documents("planner-rbac.yaml"), "Role")
    assert rules(planner) == {
        ("apps", "deployments/scale", "get"),
        ("apps", "deployments/scale", "patch"),
        ("apps", "statefulsets/scale", "get"),
        ("apps", "statefulsets/scale", "patch"),
        ("", "pods", "patch"),
        ("", "pods", "delete"),
    }
    account = one(proxy, "ServiceAccount")["metadata"]["name"]
    deployment = one(proxy, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account
    for docs, role in ((proxy, one(proxy, "Role")), (documents("planner-rbac.yaml"), planner)):
        binding = one(docs, "RoleBinding")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]


def proxy_env() -> dict[str, str]:
    c = container(one(documents("proxy.yaml"), "Deployment"))
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def test_the_proxy_environment_is_valid_settings_with_discovery_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = proxy_env()
    for name in env:
        assert name.removeprefix("FLEET_PROXY_").lower() in Settings.model_fields, name
        monkeypatch.setenv(name, env[name])
    s = load_settings()
    assert s.discovery_kubernetes and s.host == "0.0.0.0"


def test_the_example_engine_pods_are_discovered_as_backends() -> None:
    deployment = one(documents("vllm.yaml"), "Deployment")
    c = container(deployment)
    assert c["image"].startswith("vllm/vllm-openai")
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
    meta = deployment["spec"]["template"]["metadata"]
    key, _, value = proxy_env()["FLEET_PROXY_DISCOVERY_LABEL_SELECTOR"].partition("=")
    assert meta["labels"][key] == value
    pod = PodInfo(
        "vllm-0",
        "llm",
        uid="u",
        labels=meta["labels"],
        annotations=meta["annotations"],
        pod_ip="10.0.0.7",
        ready=True,
    )
    spec = backend_from_pod(pod, 8000)
    assert (spec.url, spec.role) == ("http://10.0.0.7:8000", Role.BOTH)
    assert f"--port={c['ports'][0]['containerPort']}" in c["args"]


def pod_template(name: str) -> dict[str, Any]:
    template: dict[str, Any] = one(documents(name), "Deployment")["spec"]["template"]
    return template


def test_the_proxy_image_is_the_package_version_and_not_pulled_when_present() -> None:
    # `:latest` means pull policy Always: an image loaded into the nodes would never start.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    c = container(one(documents("proxy.yaml"), "Deployment"))
    assert c["image"] == f"fleet-proxy:{pyproject['project']['version']}"
    assert c["imagePullPolicy"] == "IfNotPresent"


def test_the_engine_image_is_the_vllm_release_compose_pins() -> None:
    compose = (REPO / "docker-compose.yml").read_text()
    (pinned,) = re.findall(r"vllm/vllm-openai:\$\{VLLM_IMAGE_TAG:-([^}]+)\}", compose)
    c = container(one(documents("vllm.yaml"), "Deployment"))
    assert c["image"] == f"vllm/vllm-openai:{pinned}"
    assert c["imagePullPolicy"] == "IfNotPresent"


def test_the_proxy_runs_as_the_images_unprivileged_user() -> None:
    (user,) = re.findall(r"^USER (\d+):\d+$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    pod = pod_template("proxy.yaml")["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == int(user)
    c = container(one(documents("proxy.yaml"), "Deployment"))["securityContext"]
    assert c["allowPrivilegeEscalation"] is False
    assert c["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("name", ["proxy.yaml", "vllm.yaml", "gateway.yaml"])
def test_the_pods_metrics_are_annotated_for_prometheus(name: str) -> None:
    annotations = pod_template(name)["metadata"]["annotations"]
    c = container(one(documents(name), "Deployment"))
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) in {p["containerPort"] for p in c["ports"]}


def test_the_gateway_pool_selects_the_engine_pods_and_names_the_picker() -> None:
    docs = documents("gateway.yaml")
    pool = one(docs, "InferencePool")
    target = pool_target(pool)
    engine = one(documents("vllm.yaml"), "Deployment")
    labels = engine["spec"]["template"]["metadata"]["labels"]
    assert dict(kv.split("=") for kv in target.selector.split(",")).items() <= labels.items()
    assert f"--port={target.port}" in container(engine)["args"]
    service = one(docs, "Service")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"]
    assert ref["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    route = one(docs, "HTTPRoute")
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["kind"], backend["name"]) == ("InferencePool", pool["metadata"]["name"])


def test_the_picker_runs_the_command_line_it_documents() -> None:
    docs = documents("gateway.yaml")
    deployment = one(docs, "Deployment")
    c = container(deployment)
    assert c["args"][0] == "epp"
    args = build_epp_parser().parse_args(c["args"][1:])
    assert args.pool_name == one(docs, "InferencePool")["metadata"]["name"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert (args.port, args.metrics_port) == (ports["grpc"], ports["metrics"])
    assert args.host == "0.0.0.0"
    assert c["livenessProbe"]["grpc"] == {"port": args.port, "service": "liveness"}
    assert c["readinessProbe"]["grpc"] == {"port": args.port, "service": "readiness"}
    service = one(docs, "Service")
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    assert rules(one(docs, "Role")) == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        # The pool read at start, then watched; its objectives listed and watched.
        *(("inference.networking.k8s.io", "inferencepools", v) for v in ("get", "list", "watch")),
        *(
            ("inference.networking.x-k8s.io", "inferenceobjectives", v)
            for v in ("get", "list", "watch")
        ),
    }
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account
    assert one(docs, "RoleBinding")["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert c["image"] == container(one(documents("proxy.yaml"), "Deployment"))["image"]
