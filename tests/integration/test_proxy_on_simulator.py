"""The proxy in front of the simulator on real ports: the product as a user runs it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anthropic
import httpx
import openai
import pytest

from fleet.tokens import estimate_tokens
from fleet.types import Backend
from policies.policy import Decision, RequestContext
from simulator.fleet import SimFleet, start_fleet
from tests.support.openai_checks import chat_streams_as_it_answers
from tests.support.polling import eventually, eventually_blocking
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(2, speed=10.0) as f:
        yield f


def idle(f: SimFleet) -> bool:
    return all(not s.engine.core.running and not s.engine.core.waiting for s in f.engines)


async def test_openai_sdk_through_proxy_to_simulated_vllm(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        comp = await client.completions.create(model=MODEL, prompt="Hello there", max_tokens=8)
        assert comp.usage is not None and comp.usage.completion_tokens == 8
        await chat_streams_as_it_answers(client, MODEL)
        await client.close()


async def test_disconnect_through_proxy_frees_the_engine(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, app):
        async with httpx.AsyncClient(base_url=url) as c:
            body = {
                "model": MODEL,
                "prompt": "x " * 50,
                "max_tokens": 4000,
                "ignore_eos": True,
                "stream": True,
            }
            async with c.stream("POST", "/v1/completions", json=body) as r:
                lines = r.aiter_lines()
                for _ in range(3):
                    await anext(lines)
                assert not idle(fleet)
        await eventually(lambda: idle(fleet), what="the engines idle after the disconnect")
        for s in fleet.engines:
            assert s.engine.core.requests == {}
        assert len(app.core.live) == 0


async def test_continuation_through_proxy_is_token_exact(fleet: SimFleet) -> None:
    settings = fast_settings(fleet.urls, policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        body = {
            "model": MODEL,
            "prompt": "The fleet routes requests",
            "max_tokens": 24,
            "ignore_eos": True,
            "temperature": 0,
            "return_token_ids": True,
        }
        started = await c.post("/v1/completions", json=body)
        full = started.json()
        prompt_ids = full["choices"][0]["prompt_token_ids"] or full.get("prompt_token_ids")
        out_ids = full["choices"][0]["token_ids"]
        assert len(out_ids) == 24
        moved = 0
        for k in (1, 8, 20):
            cont = {**body, "prompt": prompt_ids + out_ids[:k], "max_tokens": 24 - k}
            r = await c.post("/v1/completions", json=cont)
            assert r.json()["choices"][0]["token_ids"] == out_ids[k:]
            moved += r.headers["x-fleet-backend"] != started.headers["x-fleet-backend"]
        # Round robin over two engines: continuations ran on the engine that did not start it.
        assert moved >= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_demo_command_serves_and_stops_cleanly() -> None:
    port, sim_port, embed_port = _free_port(), _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_PROXY_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy.serving.cli",
            "demo",
            "--port",
            str(port),
            "--engines",
            "1",
            "--sim-base-port",
            str(sim_port),
            "--embedding-base-port",
            str(embed_port),
            "--speed",
            "10",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:

        def demo_ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        eventually_blocking(demo_ready, within=60, what="the demo ready", every=0.2)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": MODEL, "prompt": "Hello", "max_tokens": 4},
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        # The demo answers an Anthropic SDK as it answers an OpenAI one.
        claude = anthropic.Anthropic(
            base_url=f"http://127.0.0.1:{port}", api_key="unused", max_retries=0, timeout=10
        )
        message = claude.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hello"}]
        )
        assert message.usage.output_tokens == 4 and message.content
        claude.close()
        # And the openai SDK's embeddings and Responses calls: the demo's fleet has an
        # embedding engine beside the generation ones, and the proxy keeps the threads.
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=10
        )
        vectors = client.embeddings.create(model="sim-embed", input=["a fleet", "a router"])
        assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 256
        first = client.responses.create(model=MODEL, input="Name a colour", max_output_tokens=4)
        then = client.responses.create(
            model=MODEL, input="And another?", previous_response_id=first.id, max_output_tokens=4
        )
        assert then.previous_response_id == first.id and then.output_text
        assert first.usage is not None and then.usage is not None
        assert then.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
        client.close()
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    text = out.decode()
    assert f"base_url = http://127.0.0.1:{port}/v1" in text
    assert '"model": "sim-llama-8b"' in text
    # The simulator child is gone with the proxy: nothing answers on its port.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{sim_port}/health", timeout=2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{embed_port}/health", timeout=2)


async def test_remote_token_counting_charges_the_backends_own_count(fleet: SimFleet) -> None:
    settings = fast_settings(fleet.urls, token_counter="remote")
    prompt = "Count these tokens exactly, please: routers, fleets and caches."
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        exact = (await c.post("/tokenize", json={"model": MODEL, "prompt": prompt})).json()["count"]
        assert exact != estimate_tokens(prompt)  # the estimate would be wrong here
        seen: list[int] = []
        original = app.core.policy.pick

        def spy(ctx, candidates, now):  # type: ignore[no-untyped-def]
            seen.append(ctx.prompt_tokens)
            return original(ctx, candidates, now)

        app.core.policy.pick = spy  # type: ignore[method-assign]
        r = await c.post(
            "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
        )
        assert r.status_code == 200
        assert seen == [exact]


async def test_remote_token_counting_spreads_over_the_backends_and_applies_the_chat_template(
    fleet: SimFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = fast_settings(fleet.urls, token_counter="remote")
    messages = [
        {"role": "system", "content": "You route requests."},
        {"role": "user", "content": "Count these tokens with the chat template, please."},
    ]
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        templated = (await c.post("/tokenize", json={"model": MODEL, "messages": messages})).json()
        seen: list[int] = []
        asked: list[str] = []
        pick = app.core.policy.pick
        control = app.core.control_client
        assert control is not None
        post = control.post

        def spy(ctx: RequestContext, candidates: Sequence[Backend], now: float) -> Decision:
            seen.append(ctx.prompt_tokens)
            return pick(ctx, candidates, now)

        async def recording_post(target: str, **kw: Any) -> httpx.Response:
            asked.append(target)
            return await post(target, **kw)

        monkeypatch.setattr(app.core.policy, "pick", spy)
        monkeypatch.setattr(control, "post", recording_post)
        r = await c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 1}
        )
        assert r.status_code == 200
        assert seen == [templated["count"]]  # the engine's own count, template applied
        for i in range(4):
            prompt = f"Prompt number {i} to count."
            r = await c.post(
                "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
            )
            assert r.status_code == 200
        tokenize_calls = [u for u in asked if u.endswith("/tokenize")]
        assert len(tokenize_calls) == 5
        assert {u.removesuffix("/tokenize") for u in tokenize_calls} == set(fleet.urls)
