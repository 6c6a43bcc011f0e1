"""Access control on a real proxy: client API keys (through the openai SDK), the backends' own
key on every call the proxy makes to them, the admin API on a public listener, and CORS."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.serving.app import create_app
from simulator.fleet import SimFleet, start_fleet
from tests.integration.test_pd_disaggregation import pd_routing
from tests.support.fake_backend import FakeBackend
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

BODY = {"model": "fake-model", "prompt": "hello", "max_tokens": 4}
SIM_MODEL = "sim-llama-8b"


@pytest.fixture
async def keyed_backend() -> AsyncIterator[FakeBackend]:
    """A backend started as `vllm serve --api-key backend-key`."""
    b = FakeBackend(api_key="backend-key")
    await b.start()
    yield b
    await b.stop()


def sdk(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


# --- client API keys


async def test_client_keys_admit_the_sdk_with_a_key_and_refuse_it_without(
    backend: FakeBackend,
) -> None:
    settings = fast_settings([backend.url], api_keys=["key-one", "key-two"])
    async with running_proxy(settings) as (url, _):
        for key in ("key-one", "key-two"):
            async with sdk(url, key) as client:
                done = await client.completions.create(**BODY)  # type: ignore[call-overload]
                assert done.choices[0].text.startswith("t0")
                stream = await client.chat.completions.create(
                    model="fake-model",
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4,
                    stream=True,
                )
                text = "".join([c.choices[0].delta.content or "" async for c in stream])
                assert text.startswith("t0")
                models = await client.models.list()
                assert [m.id for m in models.data] == ["fake-model"]
        seen = len(backend.seen)
        async with sdk(url, "key-three") as client:
            with pytest.raises(openai.AuthenticationError) as refused:
                await client.completions.create(**BODY)  # type: ignore[call-overload]
            assert refused.value.status_code == 401
            assert refused.value.code == "invalid_api_key"
            with pytest.raises(openai.AuthenticationError):
                await client.models.list()
        assert len(backend.seen) == seen  # a refused request never reaches a backend


async def test_a_refusal_is_openai_shaped_and_probes_stay_open(backend: FakeBackend) -> None:
    settings = fast_settings([backend.url], api_keys=["key-one"])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        for method, path in [
            ("POST", "/v1/completions"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/embeddings"),
            ("POST", "/tokenize"),
            ("GET", "/v1/models"),
            ("GET", "/v1/completions"),  # a wrong method is refused for the key first
            ("GET", "/v1/no-such-path"),
        ]:
            for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "key-one"}):
                r = await c.request(method, path, json=BODY, headers=headers)
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
                error = r.json()["error"]
                assert error["type"] == "invalid_request_error"
                assert error["code"] == "invalid_api_key"
                assert error["param"] is None
                assert "key-one" not in error["message"] and "nope" not in error["message"]
        missing = (await c.post("/v1/completions", json=BODY)).json()["error"]["message"]
        assert "Authorization: Bearer" in missing
        # Probes and scrapers need no key.
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/ready")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200
        # The scheme is case-insensitive, as HTTP says.
        r = await c.post("/v1/completions", json=BODY, headers={"authorization": "bearer key-one"})
        assert r.status_code == 200
        metrics = (await c.get("/metrics")).text
        assert (
            'fleet_proxy_requests_total{endpoint="completions",model="unknown",status="401"}'
            in metrics
        )


async def test_keys_from_a_file_with_comments(backend: FakeBackend, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# team a\nfile-key-a\n\n  file-key-b  # rotated 2026-01\n")
    settings = fast_settings([backend.url], api_keys_file=str(keys), api_keys="env-key")
    async with running_proxy(settings) as (url, _):
        for key in ("file-key-a", "file-key-b", "env-key"):
            async with sdk(url, key) as client:
                assert (await client.models.list()).data
        async with sdk(url, "team a") as client:
            with pytest.raises(openai.AuthenticationError):
                await client.models.list()


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "no such file"), ("# only a comment\n\n", "holds no key"), ("a key\n", "line 1")],
)
def test_a_missing_or_empty_keys_file_stops_start_up(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    keys = tmp_path / "keys.txt"
    if content is not None:
        keys.write_text(content)
    with pytest.raises(ValueError, match=problem) as e:
        create_app(fast_settings([], api_keys_file=str(keys)))
    assert str(keys) in str(e.value)


async def test_the_clients_authorization_stays_on_its_hop_unless_asked(
    backend: FakeBackend,
) -> None:
    bearer = {"authorization": "Bearer client-secret"}
    plain = fast_settings([backend.url])
    async with running_proxy(plain) as (url, _), httpx.AsyncClient(base_url=url) as c:
        assert (await c.post("/v1/completions", json=BODY, headers=bearer)).status_code == 200
    assert "authorization" not in backend.seen[-1].headers
    settings = fast_settings([backend.url], forward_client_authorization=True)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        assert (await c.post("/v1/completions", json=BODY, headers=bearer)).status_code == 200
    assert backend.seen[-1].headers["authorization"] == "Bearer client-secret"


# --- the backends' key


async def test_the_backend_key_goes_on_every_call_to_a_backend(keyed_backend: FakeBackend) -> None:
    settings = fast_settings(
        [keyed_backend.url], backend_api_key="backend-key", api_keys=["client-key"]
    )
    async with running_proxy(settings) as (url, _), sdk(url, "client-key") as client:
        done = await client.completions.create(**BODY)  # type: ignore[call-overload]
        assert done.choices[0].text.startswith("t0")
        stream = await client.completions.create(**BODY, stream=True)  # type: ignore[call-overload]
        assert "".join([c.choices[0].text async for c in stream]).startswith("t0")
        async with httpx.AsyncClient(base_url=url) as c:
            auth = {"authorization": "Bearer client-key"}
            for path in ("/v1/embeddings", "/tokenize", "/detokenize"):
                r = await c.post(path, json={"model": "fake-model", "prompt": "x"}, headers=auth)
                assert r.status_code == 200, r.text
    received = keyed_backend.paths_with("Bearer backend-key")
    assert {
        "/health",
        "/metrics",
        "/v1/models",
        "/v1/completions",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
    } <= received
    # Never without it, and the client's own key (replaced) never reaches the backend.
    assert keyed_backend.paths_with(None) == set()
    assert keyed_backend.paths_with("Bearer client-key") == set()


async def test_without_the_backend_key_a_keyed_backend_is_unusable(
    keyed_backend: FakeBackend,
) -> None:
    """What the key is for: the same proxy without it learns no model from the backend."""
    settings = fast_settings([keyed_backend.url])
    async with (
        running_proxy(settings, wait_ready=False) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        await eventually(
            lambda: "/v1/models" in keyed_backend.paths_with(None),
            what="a model listing asked of the backend without a key",
        )
        r = await c.post("/v1/completions", json=BODY)
        assert r.status_code != 200


# --- the simulator as `vllm serve --api-key`


@pytest.fixture
async def keyed_pd_fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(
        3, role=["prefill", "decode", "decode"], speed=20.0, api_key="sim-key"
    ) as f:
        yield f


async def test_the_simulator_guards_v1_as_vllm_does(keyed_pd_fleet: SimFleet) -> None:
    engine = keyed_pd_fleet.engines[0].url
    async with httpx.AsyncClient(base_url=engine) as c:
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/v1/models")).json() == {"error": "Unauthorized"}
        wrong = {"authorization": "Bearer other"}
        assert (await c.get("/v1/models", headers=wrong)).status_code == 401
        right = {"authorization": "Bearer sim-key"}
        assert (await c.get("/v1/models", headers=right)).status_code == 200
        for path in ("/health", "/metrics"):
            assert (await c.get(path)).status_code == 200
        r = await c.post("/tokenize", json={"model": SIM_MODEL, "prompt": "hi"})
        assert r.status_code == 200


async def test_keyed_engines_serve_prefill_decode_remote_counts_and_moves(
    keyed_pd_fleet: SimFleet,
) -> None:
    prefill, d1, d2 = keyed_pd_fleet.engines
    settings = fast_settings(
        [
            {"url": prefill.url, "id": "p", "role": "prefill"},
            {"url": d1.url, "id": "d1", "role": "decode"},
            {"url": d2.url, "id": "d2", "role": "decode"},
        ],
        routing=pd_routing(),
        backend_api_key="sim-key",
        token_counter="remote",
    )
    body = {
        "model": SIM_MODEL,
        "prompt": "Disaggregate this prompt please " * 20,
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    async with (
        running_proxy(settings) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        moved: dict[str, Any] = {}
        events = 0
        async with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            rid = r.headers["x-request-id"]
            assert r.headers["x-fleet-prefill"] == "p"
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                assert "error" not in json.loads(line[6:]), line
                events += 1
                if events == 5:
                    m = await c.post(f"/admin/requests/{rid}/migrate", json={})
                    moved = m.json()
        assert events >= 400
        assert moved["outcome"] == "ok", moved
        assert {moved["source"], moved["target"]} == {"d1", "d2"}
        metrics = (await c.get("/metrics")).text
        assert 'fleet_proxy_pd_prefill_legs_total{outcome="ok"} 1.0' in metrics
        tokens = app.core.tokens
        assert tokens is not None and tokens.fallbacks == 0 and tokens.cached_entries() >= 1


# --- the admin API on a public listener


async def test_admin_is_off_on_a_public_listener_without_a_token(backend: FakeBackend) -> None:
    # Bound to every address, reached through loopback: the bind address decides.
    public = fast_settings([backend.url], host="0.0.0.0")
    async with running_proxy(public) as (url, _), httpx.AsyncClient(base_url=url) as c:
        for method, path in [("GET", "/admin/backends"), ("POST", "/admin/backends/x/drain")]:
            r = await c.request(method, path)
            assert r.status_code == 403, r.text
            message = r.json()["error"]["message"]
            assert "0.0.0.0" in message and "admin_token" in message
        # The rest of the proxy serves as before.
        assert (await c.post("/v1/completions", json=BODY)).status_code == 200
    with_token = fast_settings([backend.url], host="0.0.0.0", admin_token="s3cret")
    async with running_proxy(with_token) as (url, _), httpx.AsyncClient(base_url=url) as c:
        assert (await c.get("/admin/backends")).status_code == 401
        r = await c.get("/admin/backends", headers={"x-admin-token": "s3cret"})
        assert r.status_code == 200
    loopback = fast_settings([backend.url])
    async with running_proxy(loopback) as (url, _), httpx.AsyncClient(base_url=url) as c:
        assert (await c.get("/admin/backends")).status_code == 200


# --- CORS


async def test_cors_is_off_by_default(backend: FakeBackend) -> None:
    origin = {"origin": "https://app.example"}
    plain = fast_settings([backend.url])
    async with running_proxy(plain) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/completions", json=BODY, headers=origin)
        assert r.status_code == 200
        assert "access-control-allow-origin" not in r.headers
        preflight = {**origin, "access-control-request-method": "POST"}
        r = await c.options("/v1/completions", headers=preflight)
        assert r.status_code == 405


async def test_cors_answers_preflights_and_marks_answers_on_v1(backend: FakeBackend) -> None:
    settings = fast_settings(
        [backend.url], api_keys=["key-one"], cors_allow_origins="https://app.example"
    )
    origin = {"origin": "https://app.example"}
    preflight = {
        **origin,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os",
    }
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/models"):
            r = await c.options(path, headers=preflight)  # no key: preflights carry none
            assert r.status_code == 200, r.text
            assert r.headers["access-control-allow-origin"] == "https://app.example"
            assert "POST" in r.headers["access-control-allow-methods"]
            assert "authorization" in r.headers["access-control-allow-headers"].lower()
        keyed = {**origin, "authorization": "Bearer key-one"}
        r = await c.post("/v1/completions", json=BODY, headers=keyed)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        async with c.stream(
            "POST", "/v1/completions", json={**BODY, "stream": True}, headers=keyed
        ) as s:
            assert s.headers["access-control-allow-origin"] == "https://app.example"
            assert b"[DONE]" in await s.aread()
        # A refusal is readable by the page too.
        r = await c.post("/v1/completions", json=BODY, headers=origin)
        assert r.status_code == 401
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        # Another origin gets no grant.
        other = {**preflight, "origin": "https://evil.example"}
        r = await c.options("/v1/completions", headers=other)
        assert r.status_code == 400
        assert "access-control-allow-origin" not in r.headers
        r = await c.post(
            "/v1/completions",
            json=BODY,
            headers={"origin": "https://evil.example", "authorization": "Bearer key-one"},
        )
        assert "access-control-allow-origin" not in r.headers
