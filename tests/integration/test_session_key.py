"""The session key (`session_header`, `session_body_field`) as session-affinity routing sees
it, through a real proxy in front of three backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from proxy.settings import ConfigError, load_settings
from tests.support.fake_backend import FakeBackend
from tests.support.servers import fast_settings, running_proxy

# Session affinity alone, ties broken at random: without a session, requests spread.
ROUTING = {
    "plugins": [
        {"type": "session-affinity-scorer", "name": "s"},
        {"type": "max-score-picker", "name": "max", "params": {"seed": 1}},
    ],
    "profiles": [{"name": "p", "scorers": [{"plugin": "s", "weight": 1}], "picker": "max"}],
}


@pytest.fixture
async def backends() -> AsyncIterator[list[str]]:
    started = [FakeBackend() for _ in range(3)]
    for b in started:
        await b.start()
    yield [b.url for b in started]
    for b in started:
        await b.stop()


async def sessions(c: httpx.AsyncClient) -> int:
    stats: dict[str, Any] = (await c.get("/admin/policy")).json()["stats"]
    return int(stats["s"]["sessions"])


async def post(c: httpx.AsyncClient, headers: dict[str, str] | None = None, **body: Any) -> str:
    r = await c.post(
        "/v1/completions",
        json={"model": "fake-model", "prompt": "x", "max_tokens": 1, **body},
        headers=headers,
    )
    assert r.status_code == 200
    return r.headers["x-fleet-backend"]


async def test_a_configured_header_keys_the_session_and_the_defaults_no_longer_do(backends):
    settings = fast_settings(
        backends, routing=ROUTING, session_header="X-Conversation", session_body_field=""
    )
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        chosen = {await post(c, {"x-conversation": "conv-1"}) for _ in range(8)}
        assert len(chosen) == 1
        assert await sessions(c) == 1
        for _ in range(4):
            await post(c, {"x-session-id": "other"}, user="someone")
        assert await sessions(c) == 1  # neither the old header nor `user` names a session


async def test_a_configured_body_field_keys_the_session(backends):
    settings = fast_settings(
        backends, routing=ROUTING, session_header="", session_body_field="conversation_id"
    )
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        chosen = {await post(c, conversation_id="c-9") for _ in range(8)}
        assert len(chosen) == 1
        await post(c, {"x-session-id": "ignored"})
        await post(c, conversation_id=42)  # not a string: no session
        assert await sessions(c) == 1


async def test_by_default_the_header_then_the_user_field(backends):
    async with (
        running_proxy(fast_settings(backends, routing=ROUTING)) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        by_header = {await post(c, {"x-session-id": "a"}, user="b") for _ in range(6)}
        assert len(by_header) == 1
        assert await sessions(c) == 1  # the header won over `user`
        by_user = {await post(c, user="b") for _ in range(6)}
        assert len(by_user) == 1
        assert await sessions(c) == 2


def test_the_header_must_be_a_header_name() -> None:
    with pytest.raises(ConfigError, match="session_header"):
        load_settings({"session_header": "x session"})
    assert load_settings({"session_header": "X-Conv"}).session_header == "x-conv"
