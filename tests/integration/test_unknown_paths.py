"""A path the proxy does not serve gets an OpenAI-shaped 404 that says what it does serve;
a handler's own 404 keeps its message."""

from __future__ import annotations

import httpx
import pytest

from simulator.fleet import DEFAULT_MODEL, start_fleet
from tests.support.servers import fast_settings, running_proxy


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/audio/speech"), ("POST", "/v1/assistants"), ("GET", "/v1/models/x/y")],
)
async def test_an_unserved_openai_path_is_an_openai_404(method: str, path: str) -> None:
    async with (
        running_proxy(fast_settings([]), wait_ready=False) as (url, _),
        httpx.AsyncClient() as client,
    ):
        r = await client.request(method, url + path, json={"model": "m", "input": "x"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "not_found_error" and error["code"] == 404
    assert error["message"].startswith(f"fleet-proxy does not serve {method} {path}; ")
    assert "/v1/chat/completions" in error["message"] and "/v1/embeddings" in error["message"]
    for served in ("/v1/responses", "/v1/messages", "/v1/audio/transcriptions"):
        assert served in error["message"]


async def test_a_handlers_404_keeps_its_message() -> None:
    async with (
        running_proxy(fast_settings([]), wait_ready=False) as (url, _),
        httpx.AsyncClient() as client,
    ):
        r = await client.delete(url + "/admin/backends/nope")
    assert r.status_code == 404
    assert "does not serve" not in r.json()["error"]["message"]


async def test_a_backends_own_404_reaches_the_client_in_the_openai_shape() -> None:
    """The simulator, as vLLM, answers a path it does not serve (here `/v1/completions` on an
    embedding model's engine) with a non-OpenAI 404; the client gets it in the OpenAI error
    shape, naming the backend."""
    async with (
        await start_fleet(1, profile="cpu-tiny-embed") as fleet,
        running_proxy(fast_settings(fleet.urls)) as (url, _),
        httpx.AsyncClient() as client,
    ):
        direct = await client.post(fleet.urls[0] + "/v1/completions", json={"prompt": "x"})
        assert direct.status_code == 404 and "error" not in direct.text  # not OpenAI-shaped
        r = await client.post(
            url + "/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "hello"}
        )
        # An answer already in the OpenAI shape passes through untouched.
        bad = await client.post(url + "/v1/embeddings", json={"model": "nope", "input": "x"})
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["type"] == "not_found_error" and error["code"] == 404
    assert error["message"].startswith(f"backend {r.headers['x-fleet-backend']} does not serve")
    assert "/v1/completions" in error["message"]
    assert bad.status_code == 404 and "does not serve" not in bad.json()["error"]["message"]
