"""The precise prefix-cache scorer through real proxies in front of simulated engines that
publish their KV-cache events on real ZMQ sockets (127.0.0.1): a request goes to the engine
that really holds its prefix, though no proxy routed what put it there; two proxies following
the same events make the same choice; a backend that publishes no events is scored by the
approximate index; and both worker processes of one proxy make the same choice."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fleet.precise_prefix import PrecisePrefixIndex
from proxy.serving.app import FleetProxyApp
from simulator.fleet import SimFleet, start_fleet
from simulator.kv_events_config import parse_kv_events_config
from simulator.lora import parse_lora_modules
from simulator.server import EngineServer
from simulator.tokenizer import Tokenizer
from tests.integration.test_workers import serve
from tests.support.kv_events import SIM_KV_EVENTS
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
PRECISE_ONLY = {
    "plugins": [
        {"type": "precise-prefix-cache-scorer", "name": "precise"},
        {"type": "max-score-picker", "name": "best"},
    ],
    "profiles": [{"name": "default", "scorers": ["precise"], "picker": "best"}],
}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer()


def backend_id(engine: EngineServer) -> str:
    return engine.url.removeprefix("http://")


def backend_config(engine: EngineServer, events: bool = True) -> dict[str, Any]:
    pub = engine.kv_publisher
    assert pub is not None
    config: dict[str, Any] = {"url": engine.url}
    if events:
        config["kv_events_endpoint"] = pub.endpoint
        config["kv_events_replay_endpoint"] = pub.replay_endpoint
    return config


@contextlib.asynccontextmanager
async def publishing_fleet(
    n: int, tokenizer: Tokenizer, loras: tuple[str, ...] = ()
) -> AsyncIterator[SimFleet]:
    async with await start_fleet(
        n,
        speed=20.0,
        tokenizer=tokenizer,
        kv_events=parse_kv_events_config(SIM_KV_EVENTS),
        lora=parse_lora_modules([f"{name}=/adapters/{name}" for name in loras], max_loras=2),
    ) as fleet:
        yield fleet


def chat(system: str, question: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2,
    }


def system_prompt(k: int) -> str:
    return f"System prompt {k}: you answer questions about cache-aware routing. " * 12


def holds(index: PrecisePrefixIndex, ids: list[int], engine: EngineServer) -> Callable[[], bool]:
    return lambda: index.match(ids).blocks(backend_id(engine)) > 0


def index_of(app: FleetProxyApp) -> PrecisePrefixIndex:
    index = app.core.precise_index
    assert index is not None
    return index


async def warm(client: httpx.AsyncClient, engine: EngineServer, body: dict[str, Any]) -> list[int]:
    """Send a request straight to one engine (no proxy sees it); its prompt's token ids."""
    r = await client.post(engine.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    tokens = await client.post(engine.url + "/tokenize", json=body)
    ids: list[int] = tokens.json()["tokens"]
    return ids


async def test_requests_go_to_the_engine_that_holds_their_prefix_and_replicas_agree(
    tokenizer: Tokenizer,
) -> None:
    async with publishing_fleet(3, tokenizer) as fleet:
        settings = fast_settings(
            [backend_config(e) for e in fleet.engines],
            routing=PRECISE_ONLY,
            kv_events_topic="kv",
            debug_receipts=True,
        )
        async with (
            running_proxy(settings) as (url_a, app_a),
            running_proxy(settings) as (url_b, app_b),
            httpx.AsyncClient(timeout=30) as client,
        ):
            # Each engine gets its own system prompt behind the proxies' backs.
            for k, engine in enumerate(fleet.engines):
                ids = await warm(client, engine, chat(system_prompt(k), "warm up"))
                for app in (app_a, app_b):
                    await eventually(holds(index_of(app), ids, engine))
            # A new question under system prompt k goes to engine k, through either proxy.
            for k, engine in reversed(list(enumerate(fleet.engines))):
                for url in (url_a, url_b):
                    r = await client.post(
                        url + "/v1/chat/completions",
                        json=chat(system_prompt(k), f"question via {url}"),
                        headers={"x-fleet-debug": "1"},
                    )
                    assert r.status_code == 200, r.text
                    assert r.headers["x-fleet-backend"] == backend_id(engine)
                    scores = json.loads(r.headers["x-fleet-decision"])["scores"]
                    assert scores[backend_id(engine)]["from_events"] == 1.0
            # Both proxies tokenized through the engines and never fell back.
            for app in (app_a, app_b):
                tokens = app.core.prompt_tokens
                assert tokens is not None and tokens.failures == 0 and tokens.tokenized >= 3


async def test_a_shared_prefix_workload_lands_where_its_history_is_through_any_replica(
    tokenizer: Tokenizer,
) -> None:
    async with publishing_fleet(3, tokenizer) as fleet:
        settings = fast_settings(
            [backend_config(e) for e in fleet.engines], routing=PRECISE_ONLY, kv_events_topic="kv"
        )
        async with (
            running_proxy(settings) as (url_a, _),
            running_proxy(settings) as (url_b, app_b),
            httpx.AsyncClient(timeout=30) as client,
        ):
            # Sessions sharing a system prompt, each with its own growing history, via A only.
            system = system_prompt(9)
            history: dict[int, str] = {}
            placed: dict[int, str] = {}
            for turn in range(3):
                for s in range(4):
                    history[s] = history.get(s, f"Session {s} opens. " * 20) + f" turn {turn}. "
                    r = await client.post(
                        url_a + "/v1/chat/completions", json=chat(system, history[s])
                    )
                    assert r.status_code == 200
                    if turn > 0:  # from its second turn a session stays where its history is
                        assert r.headers["x-fleet-backend"] == placed[s], (s, turn)
                    placed[s] = r.headers["x-fleet-backend"]
            # B routed none of it: the events alone send each session's next turn to the
            # same engine A chose.
            for s in range(4):
                body = chat(system, history[s] + " next")
                ids = (await client.post(fleet.urls[0] + "/tokenize", json=body)).json()["tokens"]
                engine = next(e for e in fleet.engines if backend_id(e) == placed[s])
                await eventually(holds(index_of(app_b), ids, engine))
                r = await client.post(url_b + "/v1/chat/completions", json=body)
                assert r.headers["x-fleet-backend"] == placed[s], s


async def test_a_backend_without_events_is_scored_by_the_approximate_index(
    tokenizer: Tokenizer,
) -> None:
    async with publishing_fleet(3, tokenizer) as fleet:
        silent = fleet.engines[2]
        configs = [backend_config(e, events=e is not silent) for e in fleet.engines]
        settings = fast_settings(
            configs, routing=PRECISE_ONLY, kv_events_topic="kv", debug_receipts=True
        )
        async with (
            running_proxy(settings) as (url, app),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            # The engines with events have published (a warm-up sent straight to them).
            for k, engine in enumerate(fleet.engines[:2]):
                ids = await warm(client, engine, chat(system_prompt(k), "warm up"))
                await eventually(holds(index_of(app), ids, engine))
            # Ties are broken at random: new prompts until one lands on the silent engine.
            for attempt in range(60):
                system = system_prompt(100 + attempt)
                r = await client.post("/v1/chat/completions", json=chat(system, "first"))
                if r.headers["x-fleet-backend"] == backend_id(silent):
                    break
            else:
                raise AssertionError("no request landed on the engine without events")
            r = await client.post(
                "/v1/chat/completions",
                json=chat(system, "second"),
                headers={"x-fleet-debug": "1"},
            )
            scores = json.loads(r.headers["x-fleet-decision"])["scores"]
            assert r.headers["x-fleet-backend"] == backend_id(silent)
            assert scores[backend_id(silent)]["from_events"] == 0.0
            assert scores[backend_id(silent)]["precise"] > 0.5  # the approximate index's share
            for other in fleet.engines[:2]:
                assert scores[backend_id(other)]["from_events"] == 1.0
                assert scores[backend_id(other)]["precise"] == 0.0


async def test_a_lora_adapters_prompt_goes_by_the_approximate_index(tokenizer: Tokenizer) -> None:
    """An adapter's blocks are hashed with the adapter, so the events cannot place its
    prompts: the proxy learns from /v1/models which models are adapters, does not tokenize
    their prompts, and routes them by its own record of where it sent them."""
    async with publishing_fleet(2, tokenizer, loras=("sql-lora",)) as fleet:
        settings = fast_settings(
            [backend_config(e) for e in fleet.engines],
            routing=PRECISE_ONLY,
            kv_events_topic="kv",
            debug_receipts=True,
        )
        async with (
            running_proxy(settings) as (url, app),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            await eventually(lambda: app.core.fleet.is_adapter("sql-lora"))
            assert not app.core.fleet.is_adapter(MODEL)
            for k, engine in enumerate(fleet.engines):  # both engines' events are followed
                ids = await warm(client, engine, chat(system_prompt(k), "warm up"))
                await eventually(holds(index_of(app), ids, engine))
            tokens = app.core.prompt_tokens
            assert tokens is not None
            before = tokens.tokenized
            stored = index_of(app).counters.stored
            system = system_prompt(50)
            body = {**chat(system, "first"), "model": "sql-lora"}
            first = await client.post("/v1/chat/completions", json=body)
            assert first.status_code == 200, first.text
            home = first.headers["x-fleet-backend"]
            # Its blocks reach the index salted with the adapter: no base-model prompt of the
            # same tokens matches them.
            await eventually(lambda: index_of(app).counters.stored > stored)
            ids = (await client.post(fleet.urls[0] + "/tokenize", json=body)).json()["tokens"]
            assert index_of(app).match(ids).blocks(home) == 0
            second = await client.post(
                "/v1/chat/completions",
                json={**chat(system, "second"), "model": "sql-lora"},
                headers={"x-fleet-debug": "1"},
            )
            assert second.status_code == 200, second.text
            assert second.headers["x-fleet-backend"] == home
            scores = json.loads(second.headers["x-fleet-decision"])["scores"]
            assert scores[home]["from_events"] == 0.0
            assert scores[home]["precise"] > 0.5  # the approximate index's share
            assert tokens.tokenized == before  # the proxy tokenized neither adapter request


def blocks_indexed(metrics_text: str, backend: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "fleet_proxy_kv_blocks_indexed":
            for sample in family.samples:
                if sample.labels.get("backend") == backend:
                    return sample.value
    return 0.0


@pytest.mark.slow
async def test_both_workers_of_one_proxy_follow_the_events(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    async with publishing_fleet(3, tokenizer) as fleet:
        config = {
            "backends": [backend_config(e) for e in fleet.engines],
            "routing": PRECISE_ONLY,
            "kv_events_topic": "kv",
        }
        path = tmp_path / "proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        engine = fleet.engines[1]
        async with serve([], "--config", str(path), routable=3) as served:
            async with httpx.AsyncClient(timeout=30) as client:
                ids = await warm(client, engine, chat(system_prompt(1), "warm up"))
            known: set[int] = set()

            async def every_worker_knows() -> bool:
                # One fresh connection per look: each is accepted by either worker, and both
                # requests on it are answered by that worker.
                async with httpx.AsyncClient(timeout=10) as fresh:
                    worker = (await served.workers(fresh))["answered_by"]
                    text = (await fresh.get(served.url + "/metrics")).text
                if blocks_indexed(text, backend_id(engine)) >= len(ids) // 16:
                    known.add(worker)
                return len(known) == 2

            await eventually(every_worker_knows, within=30, what="every worker knows", every=0.05)
            n = 0

            async def every_worker_routed() -> bool:
                nonlocal n
                n += 1
                async with httpx.AsyncClient(timeout=30) as fresh:
                    r = await fresh.post(
                        served.url + "/v1/chat/completions",
                        json=chat(system_prompt(1), f"question {n}"),
                    )
                    assert r.status_code == 200, r.text
                    assert r.headers["x-fleet-backend"] == backend_id(engine), n
                    rows = (await served.workers(fresh))["rows"]
                return all(row["dispatched"] > 0 for row in rows)

            await eventually(every_worker_routed, within=60, what="every worker routed", every=0.05)
