"""The proxy's route table covers every route real vLLM 0.32 serves (its /openapi.json,
captured from a generation engine, an embedding engine and a classifier), and docs/api.md lists each one
with what the proxy does with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.request.routes import (
    ANTHROPIC_PATHS,
    AUDIO_ROUTES,
    HOT_ROUTES,
    POOLING_ENDPOINTS,
    REFUSED,
    ROUTES,
)

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "tests" / "golden" / "vllm-0.32"
CAPTURES = ("openapi.json", "openapi_pooling.json", "openapi_classify.json")


def vllm_routes(name: str) -> set[tuple[str, str]]:
    document = json.loads((GOLDEN / name).read_text())
    return {(path, method.upper()) for path, ops in document["paths"].items() for method in ops}


@pytest.mark.parametrize("capture", CAPTURES)
def test_every_route_vllm_serves_has_a_line_in_the_table(capture: str) -> None:
    table = {(r.path, m) for r in ROUTES for m in r.methods}
    missing = sorted(vllm_routes(capture) - table)
    assert not missing, f"vLLM routes with no line in proxy/request/routes.py: {missing}"


def test_the_pooling_captures_routes_are_routed_as_pooling() -> None:
    how = {r.path: r.how for r in ROUTES}
    pooling = {
        p for p, _ in vllm_routes("openapi_pooling.json") | vllm_routes("openapi_classify.json")
    }
    pooling_only = pooling - {p for p, _ in vllm_routes("openapi.json")}
    assert pooling_only  # the capture shows routes a generation engine lacks
    assert {p: how[p] for p in pooling_only} == dict.fromkeys(pooling_only, "pooling")


def test_each_path_has_one_line() -> None:
    paths = [r.path for r in ROUTES]
    assert len(paths) == len(set(paths))


def test_relayed_routes_are_the_hot_routes() -> None:
    assert HOT_ROUTES["/v1/completions"] == ("completions", True)
    assert HOT_ROUTES["/v1/chat/completions"] == ("chat/completions", True)
    assert HOT_ROUTES["/v1/messages"] == ("messages", True)
    assert HOT_ROUTES["/v1/messages/count_tokens"] == ("messages/count_tokens", False)
    assert {"/v1/messages", "/v1/messages/count_tokens"} == ANTHROPIC_PATHS
    for path in ("/v1/embeddings", "/pooling", "/score", "/v1/rerank", "/v2/rerank", "/tokenize"):
        assert HOT_ROUTES[path][1] is False, path
    assert {"embeddings", "pooling", "classify", "score", "rerank"} == POOLING_ENDPOINTS
    assert not any(r.path in HOT_ROUTES for r in REFUSED)


def test_a_refused_route_says_why_with_a_status_a_client_understands() -> None:
    for route in REFUSED:
        assert route.status in (403, 501), route.path
        assert route.reason, route.path
    not_yet = {r.path for r in REFUSED if r.status == 501}
    assert {"/v1/responses/render", "/v1/messages/render"} <= not_yet
    assert "/v1/responses" not in not_yet  # served by the proxy, with its own store
    assert "/v1/audio/transcriptions" not in not_yet
    assert "/v1/messages" not in not_yet
    control = {r.path for r in REFUSED if r.status == 403}
    assert {"/scale_elastic_ep", "/sleep", "/pause"} <= control


def test_audio_uploads_and_lora_adapters_are_served() -> None:
    how = {r.path: r.how for r in ROUTES}
    assert AUDIO_ROUTES == {
        "/v1/audio/transcriptions": "audio/transcriptions",
        "/v1/audio/translations": "audio/translations",
    }
    assert not any(p in HOT_ROUTES for p in AUDIO_ROUTES)
    assert how["/v1/load_lora_adapter"] == how["/v1/unload_lora_adapter"] == "fleet"


def test_the_api_guide_lists_every_route_with_how_it_is_served() -> None:
    guide = (REPO / "docs" / "api.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in guide.splitlines()
        if line.startswith("| `/")
    }
    for route in ROUTES:
        assert route.path in rows, f"docs/api.md has no row for {route.path}"
        assert route.how in rows[route.path], (route.path, route.how)
