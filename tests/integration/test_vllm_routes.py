"""vLLM's pooling routes through the proxy, in front of simulated engines on real ports: a
fleet serving a generation model (`gen`) on one engine, an embedding model (`embed`) on two
and a classifier (`judge`) on one. Pooling requests reach only the engines serving their
model, with vLLM's answers; the routes the proxy refuses say why."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from openai import AsyncOpenAI

from fleet.registry import default_backend_id
from proxy.serving.version import installed_version
from simulator.fleet import SimFleet, start_fleet
from tests.support.servers import fast_settings, running_proxy


@contextlib.asynccontextmanager
async def mixed_fleet() -> AsyncIterator[tuple[str, SimFleet, SimFleet, SimFleet]]:
    async with (
        await start_fleet(1, profile="cpu-tiny", model="gen", speed=20) as gen,
        await start_fleet(2, profile="cpu-tiny-embed", model="embed", speed=20) as embed,
        await start_fleet(1, profile="cpu-tiny-classify", model="judge", speed=20) as judge,
        running_proxy(fast_settings(gen.urls + embed.urls + judge.urls)) as (url, _),
    ):
        yield url, gen, embed, judge


async def test_the_openai_sdk_gets_embeddings_from_the_engines_serving_the_model() -> None:
    async with mixed_fleet() as (url, _, embed, _):
        client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        seen: set[str] = set()
        for _ in range(8):
            raw = await client.embeddings.with_raw_response.create(
                model="embed", input=["hello world", "the river"]
            )
            seen.add(raw.headers["x-fleet-backend"])
            answer = raw.parse()
            assert [d.index for d in answer.data] == [0, 1]
            assert all(len(d.embedding) == 256 for d in answer.data)
            assert answer.usage.prompt_tokens > 0
        await client.close()
        # Only the embedding engines, and both of them: the policy spreads the load.
        assert seen == {default_backend_id(u) for u in embed.urls}


@pytest.mark.parametrize(
    ("path", "body", "key"),
    [
        ("/score", {"text_1": "a cat", "text_2": ["a dog", "a car"]}, "data"),
        ("/v1/score", {"text_1": "a cat", "text_2": ["a dog", "a car"]}, "data"),
        ("/rerank", {"query": "a cat", "documents": ["a dog", "a car", "a cat"]}, "results"),
        ("/v1/rerank", {"query": "a cat", "documents": ["a dog", "a car", "a cat"]}, "results"),
        ("/v2/rerank", {"query": "a cat", "documents": ["a dog", "a car", "a cat"]}, "results"),
        ("/pooling", {"input": "hello"}, "data"),
    ],
)
async def test_scoring_and_reranking_are_relayed_as_the_engine_answers(
    path: str, body: dict[str, object], key: str
) -> None:
    async with mixed_fleet() as (url, _, embed, _), httpx.AsyncClient() as client:
        request = {"model": "embed", **body}
        r = await client.post(url + path, json=request)
        direct = await client.post(embed.urls[0] + path, json=request)
    assert r.status_code == 200, r.text
    assert r.headers["x-fleet-backend"] in {default_backend_id(u) for u in embed.urls}
    got, want = r.json(), direct.json()
    assert got[key] == want[key]  # the same scores, ranks and vectors: deterministic engines
    assert got["model"] == "embed"


async def test_a_rerank_ranks_the_matching_document_first() -> None:
    async with mixed_fleet() as (url, *_), httpx.AsyncClient() as client:
        r = await client.post(
            url + "/v1/rerank",
            json={
                "model": "embed",
                "query": "the cat sat",
                "documents": ["engines hum", "the cat sat", "rivers run"],
                "top_n": 2,
            },
        )
    results = r.json()["results"]
    assert len(results) == 2 and results[0]["index"] == 1
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]


async def test_a_classifier_is_reached_for_its_model() -> None:
    async with mixed_fleet() as (url, _, _, judge), httpx.AsyncClient() as client:
        r = await client.post(url + "/classify", json={"model": "judge", "input": ["a", "b"]})
    assert r.status_code == 200, r.text
    assert r.headers["x-fleet-backend"] == default_backend_id(judge.urls[0])
    data = r.json()["data"]
    assert [d["num_classes"] for d in data] == [2, 2]
    assert all(abs(sum(d["probs"]) - 1.0) < 1e-6 for d in data)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/score", "/v1/rerank", "/classify"])
async def test_a_pooling_request_for_a_generation_model_is_a_400_naming_its_capability(
    path: str,
) -> None:
    async with mixed_fleet() as (url, *_), httpx.AsyncClient() as client:
        r = await client.post(
            url + path,
            json={"model": "gen", "input": "x", "query": "q", "documents": ["d"], "text_1": "a"},
        )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "model"
    assert error["message"].startswith(f"The model `gen` does not support {path}")
    assert "served here for generation" in error["message"]


async def test_generation_still_reaches_only_the_generation_engine() -> None:
    async with mixed_fleet() as (url, gen, *_), httpx.AsyncClient() as client:
        r = await client.post(
            url + "/v1/completions", json={"model": "gen", "prompt": "hi", "max_tokens": 3}
        )
    assert r.status_code == 200
    assert r.headers["x-fleet-backend"] == default_backend_id(gen.urls[0])


async def test_a_pooling_request_survives_a_dead_engine() -> None:
    async with mixed_fleet() as (url, _, embed, _), httpx.AsyncClient() as client:
        await embed.engines[0].crash()
        statuses = [
            (await client.post(url + "/v1/embeddings", json={"model": "embed", "input": "x"}))
            for _ in range(6)
        ]
    assert [r.status_code for r in statuses] == [200] * 6
    assert {r.headers["x-fleet-backend"] for r in statuses} == {default_backend_id(embed.urls[1])}


@pytest.mark.parametrize(
    ("method", "path", "status", "kind", "says"),
    [
        ("POST", "/v1/responses/render", 501, "not_implemented_error", "does not serve it yet"),
        ("POST", "/v1/messages/render", 501, "not_implemented_error", "does not serve it yet"),
        ("POST", "/sleep", 403, "permission_error", "it controls one engine"),
        ("POST", "/reset_prefix_cache", 403, "permission_error", "it controls one engine"),
        ("POST", "/scale_elastic_ep", 403, "permission_error", "it controls one engine"),
        ("GET", "/load", 403, "permission_error", "it describes one engine"),
    ],
)
async def test_a_refused_route_answers_why_in_the_openai_shape(
    method: str, path: str, status: int, kind: str, says: str
) -> None:
    async with (
        running_proxy(fast_settings([]), wait_ready=False) as (url, _),
        httpx.AsyncClient() as client,
    ):
        r = await client.request(method, url + path, json={"model": "m"})
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind and error["code"] == status
    assert error["message"].startswith("fleet-proxy does not serve ")
    assert says in error["message"]


async def test_a_pooling_route_takes_post_only() -> None:
    async with (
        running_proxy(fast_settings([]), wait_ready=False) as (url, _),
        httpx.AsyncClient() as client,
    ):
        r = await client.get(url + "/v2/rerank")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


async def test_version_is_the_proxys_own() -> None:
    async with (
        running_proxy(fast_settings([]), wait_ready=False) as (url, _),
        httpx.AsyncClient() as client,
    ):
        r = await client.get(url + "/version")
    assert r.status_code == 200
    assert r.json() == {"version": installed_version()}
