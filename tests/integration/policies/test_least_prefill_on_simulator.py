"""least_prefill through the real proxy, driven by the OpenAI SDK, in front of 2 simulated
engines: a conversation's next turn leaves the engine holding its history while that engine
prefills another conversation's long prompt, and the turn after follows the history to the
engine where it went."""

from __future__ import annotations

import asyncio

import openai
import pytest

from policies.loads import pending_prefill_tokens
from simulator.fleet import start_fleet
from simulator.tokenizer import Tokenizer
from tests.integration.policies.test_cache_balance_on_simulator import idle
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"


def conversation(turns: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": "You answer questions about routing. " * 40}]
    for t in range(turns):
        out.append({"role": "user", "content": f"Question {t}: " + "why is that so? " * 30})
        if t < turns - 1:
            out.append({"role": "assistant", "content": f"Answer {t}: " + "because. " * 40})
    return out


@pytest.mark.slow
async def test_a_turn_leaves_an_engine_busy_prefilling_and_the_next_follows_it() -> None:
    # Speed 0.1: the long prompt's prefill (~6,000 tokens, ~0.2 s on an H100) takes ~2 s of
    # wall time, while the proxy counts it pending on its engine.
    async with await start_fleet(2, speed=0.1, tokenizer=Tokenizer()) as fleet:
        settings = fast_settings(fleet.urls, policy="least_prefill")
        async with running_proxy(settings) as (url, app):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=60)

            async def ask(messages: list[dict[str, str]]) -> str:
                raw = await client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=1,
                )
                assert raw.parse().choices[0].message.content is not None
                return raw.headers["x-fleet-backend"]

            home = await ask(conversation(1))
            await idle(app)
            # Another conversation sharing the system prompt, with a long new question: its
            # cached share sends it to `home` too, where it prefills for a while.
            long = [*conversation(1)[:1], {"role": "user", "content": "tell me more. " * 2000}]
            busy = asyncio.create_task(ask(long))
            engine = next(b for b in app.core.fleet if b.id == home)
            await eventually(
                lambda: pending_prefill_tokens(engine) > 4000, within=10, what="a long prefill"
            )
            moved = await ask(conversation(2))
            assert not busy.done(), "the long prefill ended before the turn was routed"
            assert await busy == home
            assert moved != home
            await idle(app)
            # The third turn's longest cached prefix is where the second went.
            assert await ask(conversation(3)) == moved
            await client.close()
            stats = app.core.policy.stats()["least_prefill"]
        assert stats == {"cached": 2, "cold": 2}, stats  # the turn that moved found nothing
