"""Prefix-aware routing through the real proxy in front of simulated vLLM engines.

The same multi-turn, shared-prefix requests go through the proxy once per policy, each time to
a fresh fleet of 4 simulated engines; the engines' own `/metrics` count the prefix-cache hits.
"""

from __future__ import annotations

import json
import random

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.fleet import start_fleet
from simulator.tokenizer import Tokenizer
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
SESSIONS = 6
TURNS = 4


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer()


def conversation_order(seed: int = 11) -> list[tuple[int, int]]:
    """(session, turn) pairs in a shuffled order that keeps each session's turns in order."""
    rng = random.Random(seed)
    next_turn = [0] * SESSIONS
    order = []
    while any(t < TURNS for t in next_turn):
        s = rng.choice([s for s in range(SESSIONS) if next_turn[s] < TURNS])
        order.append((s, next_turn[s]))
        next_turn[s] += 1
    return order


def prompt(session: int, turn: int) -> str:
    system = f"Session {session} system prompt: you help with fleet routing. " * 30
    history = "".join(
        f"\nUser turn {t} of session {session}: please explain item {t}. " + "detail " * 60
        for t in range(turn + 1)
    )
    return system + history


def prefix_hits(metrics_text: str) -> float:
    for fam in text_string_to_metric_families(metrics_text):
        if fam.name == "vllm:prefix_cache_hits":
            return sum(s.value for s in fam.samples if s.name.endswith("_total"))
    raise AssertionError("no vllm:prefix_cache_hits_total on the engine's /metrics")


async def replay(policy: str, tokenizer: Tokenizer) -> tuple[float, list[str]]:
    """Total prefix-cache hit tokens over the fleet, and the backend of each request."""
    async with await start_fleet(4, speed=20.0, tokenizer=tokenizer) as fleet:
        async with (
            running_proxy(fast_settings(fleet.urls, policy=policy)) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            chosen = []
            for session, turn in conversation_order():
                r = await client.post(
                    "/v1/completions",
                    json={"model": MODEL, "prompt": prompt(session, turn), "max_tokens": 2},
                    headers={"x-session-id": f"s{session}"},
                )
                assert r.status_code == 200, r.text
                chosen.append(r.headers["x-fleet-backend"])
        hits = 0.0
        async with httpx.AsyncClient() as client:
            for engine_url in fleet.urls:
                hits += prefix_hits((await client.get(engine_url + "/metrics")).text)
    return hits, chosen


async def test_prefix_aware_policies_get_more_cache_hits_than_round_robin(
    tokenizer: Tokenizer,
) -> None:
    baseline, rr_chosen = await replay("round_robin", tokenizer)
    assert len(set(rr_chosen)) == 4  # round-robin really spread the requests
    for policy in ("lmetric", "unified", "prefix_aware"):
        hits, chosen = await replay(policy, tokenizer)
        print(f"{policy}: {hits:.0f} prefix-hit tokens vs round_robin {baseline:.0f}")
        assert hits > baseline * 1.5, (policy, hits, baseline)
        assert len(set(chosen)) > 1, policy  # sessions still spread over the fleet


async def test_decision_receipt_shows_every_candidate(tokenizer: Tokenizer) -> None:
    async with (
        await start_fleet(3, speed=20.0, tokenizer=tokenizer) as fleet,
        running_proxy(fast_settings(fleet.urls, policy="lmetric", debug_receipts=True)) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        r = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": prompt(0, 0), "max_tokens": 2},
            headers={"x-fleet-debug": "1"},
        )
        assert r.status_code == 200
        receipt = json.loads(r.headers["x-fleet-decision"])
        assert receipt["scores"].keys() == {u.removeprefix("http://") for u in fleet.urls}
        for scores in receipt["scores"].values():
            assert {"p_tokens", "bs", "lmetric", "uncached_tokens"} <= scores.keys()
        assert r.headers["x-fleet-backend"] in receipt["scores"]
