"""Every manifest of deploy/kubernetes/ against the Kubernetes API's own schemas (the OpenAPI
schemas kubernetes-validate ships, strict: an unknown field fails), for the newest Kubernetes
version it knows and the oldest the manifests claim to support. The Gateway API and Inference
Extension kinds (HTTPRoute, InferencePool) are custom resources whose schemas it does not
ship: their required fields are checked here by hand, as their CRDs declare them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
CUSTOM_KINDS = {"InferencePool", "HTTPRoute"}
# The oldest Kubernetes release the manifests are checked against (gRPC probes are GA in 1.27).
OLDEST = "1.27.0"


def every_document() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


DOCUMENTS = every_document()


def test_the_manifests_are_found() -> None:
    names = {p.name for p in MANIFESTS}
    assert {"gateway.yaml", "proxy.yaml", "vllm.yaml", "planner-rbac.yaml"} <= names
    assert {doc["kind"] for _, doc in DOCUMENTS} >= {"Deployment", "Service", *CUSTOM_KINDS}


@pytest.mark.parametrize("version", [kubernetes_validate.latest_version(), OLDEST])
@pytest.mark.parametrize(
    ("where", "doc"),
    [d for d in DOCUMENTS if d[1]["kind"] not in CUSTOM_KINDS],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_built_in_kinds_match_the_kubernetes_schema(
    where: str, doc: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_a_wrong_field_is_caught() -> None:
    """The check bites: a misspelt field and a wrong type fail."""
    (_, deployment) = next(d for d in DOCUMENTS if d[1]["kind"] == "Deployment")
    bad = yaml.safe_load(yaml.safe_dump(deployment))
    bad["spec"]["replica"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)
    bad = yaml.safe_load(yaml.safe_dump(deployment))
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)


def custom(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCUMENTS if doc["kind"] == kind]


# RFC 1123 subdomain: an object name (metadata.name of both kinds, and refs' names).
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_the_inference_pool_has_the_fields_its_crd_requires() -> None:
    """inference.networking.k8s.io/v1 InferencePool: `spec.selector` (`matchLabels` only, at
    least one label), `spec.targetPorts` (1 to 8 items, each a unique `number` in 1..65535),
    `spec.endpointPickerRef` with a `name`, and a `port.number` when its `kind` is a Service
    (the default); `failureMode` one of FailOpen, FailClose."""
    (pool,) = custom("InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert NAME.match(pool["metadata"]["name"])
    spec = pool["spec"]
    assert set(spec) <= {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    assert set(spec["selector"]) == {"matchLabels"} and spec["selector"]["matchLabels"]
    ports = [p["number"] for p in spec["targetPorts"]]
    assert 1 <= len(ports) <= 8 and len(set(ports)) == len(ports)
    assert all(isinstance(n, int) and 1 <= n <= 65535 for n in ports)
    assert spec.get("appProtocol", "http") in {"http", "kubernetes.io/h2c"}
    ref = spec["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"}
    assert NAME.match(ref["name"])
    if ref.get("kind", "Service") == "Service":
        assert 1 <= ref["port"]["number"] <= 65535
    assert ref.get("failureMode", "FailClose") in {"FailOpen", "FailClose"}


def test_the_http_route_has_the_fields_its_crd_requires() -> None:
    """gateway.networking.k8s.io/v1 HTTPRoute: `spec.parentRefs[]` each with a `name`;
    `spec.rules` at most 16, each `matches` at most 64 with a path `type` of Exact,
    PathPrefix or RegularExpression and a `value` starting with `/`; `backendRefs[]` each with
    a `name`, and a `port` when the kind is a core Service (the default). Here the backend is
    the InferencePool by its group and kind, which the Inference Extension defines."""
    (route,) = custom("HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    spec = route["spec"]
    assert set(spec) <= {"parentRefs", "hostnames", "rules"}
    assert spec["parentRefs"] and all(NAME.match(p["name"]) for p in spec["parentRefs"])
    assert 1 <= len(spec["rules"]) <= 16
    pools = {p["metadata"]["name"] for p in custom("InferencePool")}
    for rule in spec["rules"]:
        assert len(rule.get("matches", [])) <= 64
        for match in rule.get("matches", []):
            path = match.get("path", {"type": "PathPrefix", "value": "/"})
            assert path["type"] in {"Exact", "PathPrefix", "RegularExpression"}
            assert path["value"].startswith("/")
        for ref in rule["backendRefs"]:
            assert NAME.match(ref["name"])
            if ref.get("group", "") == "" and ref.get("kind", "Service") == "Service":
                assert "port" in ref
            else:
                assert (ref["group"], ref["kind"]) == (
                    "inference.networking.k8s.io",
                    "InferencePool",
                )
                assert ref["name"] in pools
