"""The hybrid "unified" policy through real proxies in front of simulated engines that publish
their KV-cache events: a session's turn follows the engine holding its longest cached prefix
(after a turn was sent elsewhere while its engine was drained), not the session's rendezvous
home; and two replicas, or the two workers of one proxy, following the same events send a
session's turn to the same engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from policies.loads import batch_size
from policies.rendezvous import home
from proxy.serving.app import FleetProxyApp
from simulator.server import EngineServer
from simulator.tokenizer import Tokenizer
from tests.integration.policies.test_precise_prefix_on_simulator import (
    backend_config,
    backend_id,
    blocks_indexed,
    chat,
    holds,
    index_of,
    publishing_fleet,
    system_prompt,
    warm,
)
from tests.integration.test_workers import serve
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy
from tests.unit.policies.builders import backend

UNIFIED = {"policy": "unified", "precise_prefix": {}}
# Where processes must agree, the overload rule is left out: one request at a time, the engine
# that served the last turn may still count it running in one process's scrape and not in the
# other's, which the relative rule calls overloaded (1 > 2 x 1/3). tests/unit covers it.
AGREEING = {**UNIFIED, "params": {"overload_factor": 1000, "ceiling_factor": None}}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer()


def session_not_homed_on(engine: EngineServer, engines: list[EngineServer], tag: str) -> str:
    """A session id whose rendezvous home among the engines is not `engine`."""
    pool = [backend(backend_id(e)) for e in engines]
    return next(
        sid
        for sid in (f"{tag}-{i}" for i in range(1000))
        if home(sid, pool).id != backend_id(engine)
    )


def opening(session: str) -> str:
    return f"Session {session} opens with a long account of its question. " * 12


async def tokens_of(
    client: httpx.AsyncClient, engine: EngineServer, body: dict[str, Any]
) -> list[int]:
    ids: list[int] = (await client.post(engine.url + "/tokenize", json=body)).json()["tokens"]
    return ids


async def idle(app: FleetProxyApp) -> None:
    """Every backend idle in the proxy's view (its own count and its last scrape), so the
    overload rule sees an idle fleet."""

    def all_idle() -> bool:
        return all(batch_size(b) == 0 for b in app.core.fleet)

    await eventually(all_idle, within=10, what="an idle fleet")


async def test_a_turn_follows_the_longer_prefix_left_where_its_engine_drained_it(
    tokenizer: Tokenizer,
) -> None:
    async with publishing_fleet(3, tokenizer) as fleet:
        first = fleet.engines[0]
        settings = fast_settings(
            [backend_config(e) for e in fleet.engines],
            routing=UNIFIED,
            kv_events_topic="kv",
            debug_receipts=True,
        )
        sid = session_not_homed_on(first, fleet.engines, "drain")
        system = system_prompt(3)
        history = opening(sid)
        async with (
            running_proxy(settings) as (url, app),
            httpx.AsyncClient(timeout=30) as client,
        ):
            # The session's opening is cached on `first` (a request straight to it), whose
            # cache is the owner's from then on though the session's home is elsewhere.
            ids = await warm(client, first, chat(system, history))
            await eventually(holds(index_of(app), ids, first))

            async def turn(text: str) -> httpx.Response:
                await idle(app)
                body = chat(system, text)
                r = await client.post(
                    url + "/v1/chat/completions",
                    json=body,
                    headers={"x-session-id": sid, "x-fleet-debug": "1"},
                )
                assert r.status_code == 200, r.text
                engine = next(
                    e for e in fleet.engines if backend_id(e) == r.headers["x-fleet-backend"]
                )
                await eventually(
                    holds(index_of(app), await tokens_of(client, engine, body), engine)
                )
                return r

            history += " Turn one."
            r = await turn(history)
            assert r.headers["x-fleet-backend"] == backend_id(first)
            assert json.loads(r.headers["x-fleet-decision"])["reason"] == "unified: affinity"

            admin = url + f"/admin/backends/{backend_id(first)}"
            assert (await client.post(admin + "/drain")).status_code == 200
            history += " Turn two, while the first engine drains."
            away = (await turn(history)).headers["x-fleet-backend"]
            assert away != backend_id(first)
            assert (await client.post(admin + "/undrain")).status_code == 200
            back = app.core.fleet.get(backend_id(first))
            assert back is not None
            await eventually(lambda: not back.draining)

            # `first` holds the opening and turn one; `away` holds turn two as well.
            history += " Turn three."
            r = await turn(history)
            decision = json.loads(r.headers["x-fleet-decision"])
            assert r.headers["x-fleet-backend"] == away, decision
            assert decision["reason"] == "unified: affinity"
            scores = decision["scores"]
            assert scores[away]["owner"] == 1.0 and scores[away]["cache_ratio"] > 0.5


async def test_two_replicas_following_the_same_events_send_a_session_to_the_same_engine(
    tokenizer: Tokenizer,
) -> None:
    async with publishing_fleet(3, tokenizer) as fleet:
        settings = fast_settings(
            [backend_config(e) for e in fleet.engines],
            routing=AGREEING,
            kv_events_topic="kv",
            debug_receipts=True,
        )
        async with (
            running_proxy(settings) as (url_a, app_a),
            running_proxy(settings) as (url_b, app_b),
            httpx.AsyncClient(timeout=30) as client,
        ):
            # Each engine holds one session's opening, put there behind both proxies' backs.
            sessions: dict[str, EngineServer] = {}
            history: dict[str, str] = {}
            system = system_prompt(4)
            for k, engine in enumerate(fleet.engines):
                sid = session_not_homed_on(engine, fleet.engines, f"replica{k}")
                sessions[sid], history[sid] = engine, opening(sid)
                ids = await warm(client, engine, chat(system, history[sid]))
                for app in (app_a, app_b):
                    await eventually(holds(index_of(app), ids, engine))
            # Every turn of every session through either replica lands on its engine.
            for turn in range(3):
                for sid, engine in sessions.items():
                    history[sid] += f" Turn {turn}."
                    body = chat(system, history[sid])
                    for url in (url_a, url_b):
                        r = await client.post(
                            url + "/v1/chat/completions",
                            json=body,
                            headers={"x-session-id": sid, "x-fleet-debug": "1"},
                        )
                        assert r.status_code == 200, r.text
                        assert r.headers["x-fleet-backend"] == backend_id(engine), (
                            sid,
                            turn,
                            url,
                            r.headers["x-fleet-decision"],
                        )
                    ids = await tokens_of(client, engine, body)
                    for app in (app_a, app_b):
                        await eventually(holds(index_of(app), ids, engine))


@pytest.mark.slow
async def test_both_workers_of_one_proxy_send_a_session_to_the_same_engine(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    async with publishing_fleet(3, tokenizer) as fleet:
        config = {
            "backends": [backend_config(e) for e in fleet.engines],
            "routing": AGREEING,
            "kv_events_topic": "kv",
            "debug_receipts": True,
        }
        path = tmp_path / "proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        sessions: dict[str, EngineServer] = {}
        history: dict[str, str] = {}
        system = system_prompt(5)
        async with serve([], "--config", str(path), routable=3) as served:
            async with httpx.AsyncClient(timeout=30) as client:
                least: dict[str, int] = {}
                for k, engine in enumerate(fleet.engines):
                    sid = session_not_homed_on(engine, fleet.engines, f"worker{k}")
                    sessions[sid], history[sid] = engine, opening(sid)
                    ids = await warm(client, engine, chat(system, history[sid]))
                    least[backend_id(engine)] = len(ids) // 16
            known: set[int] = set()

            async def every_worker_knows() -> bool:
                # One fresh connection per look: either worker may accept it.
                async with httpx.AsyncClient(timeout=10) as fresh:
                    worker = (await served.workers(fresh))["answered_by"]
                    text = (await fresh.get(served.url + "/metrics")).text
                if all(blocks_indexed(text, bid) >= n for bid, n in least.items()):
                    known.add(worker)
                return len(known) == 2

            await eventually(every_worker_knows, within=30, what="every worker knows", every=0.05)
            n = 0

            async def every_worker_routed() -> bool:
                nonlocal n
                n += 1
                for sid, engine in sessions.items():
                    async with httpx.AsyncClient(timeout=30) as fresh:
                        r = await fresh.post(
                            served.url + "/v1/chat/completions",
                            json=chat(system, history[sid] + f" Question {n}."),
                            headers={"x-session-id": sid, "x-fleet-debug": "1"},
                        )
                    assert r.status_code == 200, r.text
                    assert r.headers["x-fleet-backend"] == backend_id(engine), (
                        sid,
                        n,
                        r.headers["x-fleet-decision"],
                    )
                async with httpx.AsyncClient(timeout=10) as fresh:
                    rows = (await served.workers(fresh))["rows"]
                return all(row["dispatched"] >= len(sessions) for row in rows)

            await eventually(every_worker_routed, within=60, what="every worker routed", every=0.05)
