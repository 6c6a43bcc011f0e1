"""A path the proxy does not serve gets an OpenAI-shaped 404 that says what it does serve;
a handler's own 404 keeps its message."""

from __future__ import annotations

import httpx
import pytest

from tests.support.servers import fast_settings, running_proxy


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/audio/speech"), ("POST", "/v1/responses"), ("GET", "/v1/models/x/y")],
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


async def test_a_handlers_404_keeps_its_message() -> None:
    async with (
        running_proxy(fast_settings([]), wait_ready=False) as (url, _),
        httpx.AsyncClient() as client,
    ):
        r = await client.delete(url + "/admin/backends/nope")
    assert r.status_code == 404
    assert "does not serve" not in r.json()["error"]["message"]
