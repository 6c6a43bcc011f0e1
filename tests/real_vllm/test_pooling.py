"""Pooling routes through fleet-proxy against a real vLLM embedding engine.

One proxy in front of a generation engine (the ordinary pair's first, model `tiny`) and an
engine running the same weights as an embedding model under another name: pooling requests
must reach the pooling engine alone, answered as that engine answers them directly, and a
pooling request for the generation model gets the proxy's 400 naming what the model supports.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest

from tests.real_vllm.tier import Proxy, Tier, engine_samples, start_proxy

pytestmark = pytest.mark.real_vllm

TEXTS = ["hello world", "the river and the mountain"]
# Fields that differ between two answers to the same request.
PER_ANSWER = ("id", "created")


@pytest.fixture(scope="module")
def mixed(tier: Tier, pooling_tier: Tier) -> Tier:
    """The generation engine and the pooling engine, as one fleet."""
    return replace(tier, engines=(tier.engines[0], pooling_tier.engines[0]))


@pytest.fixture(scope="module")
def mixed_proxy(mixed: Tier, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    proxy = start_proxy(mixed, "round_robin", tmp_path_factory.mktemp("pooling-proxy"))
    yield proxy
    proxy.stop()


def sdk(proxy: Proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=120)


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url, json=body, timeout=120)


def same_answer(through_proxy: dict[str, Any], direct: dict[str, Any]) -> None:
    def strip(answer: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in answer.items() if k not in PER_ANSWER}

    assert strip(through_proxy) == strip(direct)


def unrouted_posts(url: str) -> float:
    """POSTs the engine answered for a path it does not serve (vLLM's HTTP metrics group them
    under handler "none"): a generation engine's answer to a pooling route."""
    return sum(
        value
        for name, labels, value in engine_samples(url)
        if name == "http_requests_total"
        and labels.get("handler") == "none"
        and labels.get("method") == "POST"
    )


def test_embeddings_through_the_proxy_equal_the_engines(
    mixed_proxy: Proxy, pooling_tier: Tier
) -> None:
    engine = pooling_tier.engines[0]
    # The SDK asks for base64 and decodes it; the engine is asked for floats directly.
    raw = sdk(mixed_proxy).embeddings.with_raw_response.create(
        model=pooling_tier.model, input=TEXTS
    )
    embeddings = raw.parse()
    assert raw.headers["x-fleet-backend"] == engine.backend_id
    direct = post(
        f"{engine.url}/v1/embeddings",
        {"model": pooling_tier.model, "input": TEXTS, "encoding_format": "float"},
    )
    direct.raise_for_status()
    expected = [d["embedding"] for d in direct.json()["data"]]
    assert [e.embedding for e in embeddings.data] == expected
    assert len(expected[0]) > 1 and expected[0] != expected[1]
    assert embeddings.model == pooling_tier.model
    assert embeddings.usage.prompt_tokens == direct.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/score", {"text_1": "a cat", "text_2": ["a dog", "a car"]}),
        ("/v1/rerank", {"query": "a cat", "documents": ["a dog", "a car"], "top_n": 1}),
    ],
)
def test_score_and_rerank_answer_as_the_engine_does(
    mixed_proxy: Proxy, pooling_tier: Tier, path: str, fields: dict[str, Any]
) -> None:
    engine = pooling_tier.engines[0]
    body = {"model": pooling_tier.model, **fields}
    through = post(f"{mixed_proxy.url}{path}", body)
    assert through.status_code == 200, through.text
    assert through.headers["x-fleet-backend"] == engine.backend_id
    direct = post(f"{engine.url}{path}", body)
    direct.raise_for_status()
    same_answer(through.json(), direct.json())


def test_pooling_requests_go_to_the_pooling_engine_alone(
    mixed_proxy: Proxy, mixed: Tier, pooling_tier: Tier
) -> None:
    generation, pooling = mixed.engines
    client = sdk(mixed_proxy)
    # The generation engine answers a pooling route it lacks with a bare 404, which the proxy
    # turns into a 400 naming what the model supports; vLLM counts that 404 here.
    before = unrouted_posts(generation.url)
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=mixed.model, input=TEXTS)
    assert refused.value.status_code == 400
    message = str(refused.value.body)
    assert f"`{mixed.model}` does not support /v1/embeddings" in message, message
    assert "served here for generation" in message and "pooling" in message
    assert unrouted_posts(generation.url) == before + 1
    # round_robin would alternate between the two backends if both were candidates.
    for _ in range(4):
        raw = client.embeddings.with_raw_response.create(model=pooling_tier.model, input=TEXTS)
        assert raw.headers["x-fleet-backend"] == pooling.backend_id
        assert len(raw.parse().data) == len(TEXTS)
    assert unrouted_posts(generation.url) == before + 1, "a pooling request reached it"
