"""The session key (`session_header`, `session_body_field`) as session-affinity routing sees
it, through a real proxy in front of three backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from fleet.types import Backend
from policies.rendezvous import home
from proxy.settings import ConfigError, load_settings
from tests.support.fake_backend import FakeBackend
from tests.support.servers import fast_settings, running_proxy
from tests.unit.policies.builders import backend

# Session affinity alone, ties broken at random: a session goes to its rendezvous home,
# requests without one spread.
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


def pool(urls: list[str]) -> list[Backend]:
    return [backend(u.removeprefix("http://")) for u in urls]  # the proxy's backend ids


def home_of(session: str, urls: list[str]) -> str:
    return home(session, pool(urls)).id


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
        assert chosen == {home_of("conv-1", backends)}
        # Neither the old header nor `user` names a session: these spread.
        unkeyed = {await post(c, {"x-session-id": "other"}, user="someone") for _ in range(12)}
        assert len(unkeyed) > 1


async def test_a_configured_body_field_keys_the_session(backends):
    settings = fast_settings(
        backends, routing=ROUTING, session_header="", session_body_field="conversation_id"
    )
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        chosen = {await post(c, conversation_id="c-9") for _ in range(8)}
        assert chosen == {home_of("c-9", backends)}
        assert len({await post(c, {"x-session-id": "ignored"}) for _ in range(12)}) > 1
        assert len({await post(c, conversation_id=42) for _ in range(12)}) > 1  # not a string


async def test_by_default_the_header_then_the_user_field(backends):
    # A header and a user value whose homes differ, so the one that keys the session shows.
    header = next(
        f"h{i}" for i in range(100) if home_of(f"h{i}", backends) != home_of("b", backends)
    )
    async with (
        running_proxy(fast_settings(backends, routing=ROUTING)) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        by_header = {await post(c, {"x-session-id": header}, user="b") for _ in range(6)}
        assert by_header == {home_of(header, backends)}  # the header won over `user`
        by_user = {await post(c, user="b") for _ in range(6)}
        assert by_user == {home_of("b", backends)}


def test_the_header_must_be_a_header_name() -> None:
    with pytest.raises(ConfigError, match="session_header"):
        load_settings({"session_header": "x session"})
    assert load_settings({"session_header": "X-Conv"}).session_header == "x-conv"
