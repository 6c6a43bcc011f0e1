"""cache_balance through the real proxy, driven by the OpenAI SDK, in front of 4 simulated
engines: each conversation's opening lands on an engine caching nothing yet (one per
engine), and every later turn follows the engine holding its history, whose prefix-cache hits
the engines' own /metrics count."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from policies.loads import batch_size
from proxy.serving.app import FleetProxyApp
from simulator.fleet import start_fleet
from simulator.tokenizer import Tokenizer
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
SESSIONS = 4
TURNS = 3


def messages(session: int, turns: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": f"Conversation {session} about routing. " * 40}]
    for t in range(turns):
        out.append({"role": "user", "content": f"Question {t} of {session}: " + "why? " * 80})
        if t < turns - 1:
            out.append({"role": "assistant", "content": f"Answer {t}: " + "because. " * 40})
    return out


def prefix_hits(metrics_text: str) -> float:
    for fam in text_string_to_metric_families(metrics_text):
        if fam.name == "vllm:prefix_cache_hits":
            return sum(s.value for s in fam.samples if s.name.endswith("_total"))
    raise AssertionError("no vllm:prefix_cache_hits_total on the engine's /metrics")


async def idle(app: FleetProxyApp) -> None:
    """Every backend idle in the proxy's view (its count and its last scrape), so the load
    rules see an idle fleet and only the cache decides."""
    await eventually(
        lambda: all(batch_size(b) == 0 for b in app.core.fleet), within=10, what="an idle fleet"
    )


@pytest.mark.slow
async def test_openings_spread_to_empty_engines_and_turns_follow_their_history() -> None:
    async with await start_fleet(4, speed=20.0, tokenizer=Tokenizer()) as fleet:
        settings = fast_settings(fleet.urls, policy="cache_balance")
        async with running_proxy(settings) as (url, app):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=30)
            served: dict[int, list[str]] = {s: [] for s in range(SESSIONS)}
            for turn in range(1, TURNS + 1):
                for s in range(SESSIONS):
                    await idle(app)
                    raw = await client.chat.completions.with_raw_response.create(
                        model=MODEL,
                        messages=messages(s, turn),
                        max_tokens=2,  # type: ignore[arg-type]
                    )
                    assert raw.parse().choices[0].message.content
                    served[s].append(raw.headers["x-fleet-backend"])
            await client.close()
            stats = app.core.policy.stats()["cache_balance"]
        openings = {s: engines[0] for s, engines in served.items()}
        assert len(set(openings.values())) == SESSIONS, served  # one engine each
        for s, engines in served.items():
            assert engines == [openings[s]] * TURNS, (s, served)
        assert stats["cold"] == SESSIONS and stats["owner"] == SESSIONS * (TURNS - 1), stats
        async with httpx.AsyncClient(timeout=10) as http:
            for engine_url in fleet.urls:
                assert prefix_hits((await http.get(engine_url + "/metrics")).text) > 0
