"""Model aliases through a real proxy: the backend sees the served name."""

from __future__ import annotations

import httpx
import orjson
import pytest

from proxy.settings import ConfigError, load_settings
from tests.support.servers import fast_settings, running_proxy

ALIASES = {"gpt-4o-mini": "fake-model", "elsewhere": "not-served"}


async def test_an_alias_reaches_the_backend_as_the_served_name(backend):
    settings = fast_settings([backend.url], model_aliases=ALIASES)
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        body = {"model": "gpt-4o-mini", "prompt": "hello", "max_tokens": 3, "top_k": 7}
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200
        assert r.json()["model"] == "fake-model"  # the answer keeps the served name
        assert backend.seen[-1].body == {**body, "model": "fake-model"}

        chat = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        }
        r = await c.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200
        assert r.text.rstrip().endswith("data: [DONE]")
        assert backend.seen[-1].body["model"] == "fake-model"

        # A served name passes as the client sent it.
        raw = b'{"model": "fake-model",  "prompt": "x"}'
        r = await c.post(
            "/v1/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert r.status_code == 200
        assert backend.seen[-1].body == orjson.loads(raw)

        # An alias whose model nobody serves is an unknown model.
        r = await c.post("/v1/completions", json={**body, "model": "elsewhere"})
        assert r.status_code == 404

        listed = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}
        assert listed["gpt-4o-mini"]["root"] == "fake-model"
        assert "fake-model" in listed
        assert "elsewhere" not in listed
    served = {"endpoint": "completions", "model": "fake-model", "status": "200"}
    assert app.core.prom.get_sample_value("fleet_proxy_requests_total", served) == 2


def test_an_alias_may_not_name_another_alias() -> None:
    with pytest.raises(ConfigError, match="itself an alias"):
        load_settings({"model_aliases": {"a": "b", "b": "c"}})
    with pytest.raises(ConfigError, match="non-empty"):
        load_settings({"model_aliases": {"a": ""}})
