"""Session and program homes hold across processes: `fleet-proxy serve --workers 2`, and two
separate proxies (replicas), in front of the same simulated engines on real ports send every
request of a session to the session's rendezvous home, whichever process accepts it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from policies.rendezvous import home
from simulator.fleet import SimFleet, start_fleet
from simulator.tokenizer import Tokenizer
from tests.integration.test_workers import Served, serve
from tests.support.polling import eventually
from tests.unit.policies.builders import backend

MODEL = "sim-llama-8b"
SESSIONS = 12
TURNS = 4
# The agreement is the point here, not the overload rule (tests/unit/policies/test_unified.py):
# one request at a time, the engine that served the last turn may still count it running in
# a worker's scrape, which the relative rule calls overloaded (1 > 2 x 1/3).
# `session_home: always`: the rendezvous home is the whole affinity (the default follows the
# engine holding the session's cache: tests/integration/policies/test_unified_owner_on_simulator.py).
UNIFIED = (
    "routing: {policy: unified, params: {overload_factor: 1000, ceiling_factor: null,"
    " session_home: always}}\n"
)
AUTELLIX = "routing: {policy: autellix}\n"
LARGE = "word " * 3000  # above Autellix's 2048 tokens: a large call goes to the program's home


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(3, speed=50.0, tokenizer=Tokenizer()) as f:
        yield f


def homes(fleet: SimFleet) -> dict[str, str]:
    pool = [backend(u.removeprefix("http://")) for u in fleet.urls]  # the proxies' ids
    return {f"s{s}": home(f"s{s}", pool).id for s in range(SESSIONS)}


def prompt(session: str, turn: int, base: str = "") -> str:
    """Turn `turn` of a session re-sends the ones before it, as a chat client does."""
    return (
        base
        + f"Session {session}. "
        + "".join(f"User turn {t}: tell me about item {t}. " * 8 for t in range(turn + 1))
    )


async def ask(url: str, session: str, text: str, want: str) -> None:
    """One request, on a new connection (either worker may accept it), to land on `want`."""
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(
            url + "/v1/completions",
            json={"model": MODEL, "prompt": text, "max_tokens": 2},
            headers={"x-session-id": session, "x-fleet-debug": "1"},
        )
    assert r.status_code == 200, r.text
    assert r.headers["x-fleet-backend"] == want, r.headers.get("x-fleet-decision")


async def dispatched(served: Served, total: int) -> list[int]:
    """Requests dispatched per worker, once the shared rows count all `total`."""
    rows: list[int] = []

    async def counted() -> bool:
        nonlocal rows
        async with httpx.AsyncClient(timeout=5) as client:
            info = await served.workers(client)
        rows = [row["dispatched"] for row in info["rows"]]
        return sum(rows) == total

    await eventually(counted, within=10, what="counted", every=0.05)
    return rows


# Each process decides alone whether a backend is routable (its own probes and scrapes): on a
# starved machine one may drop the home for a moment and use the next-ranked backend, which is
# the rule, not a disagreement. Slow probes and scrapes must not take a backend out here.
STEADY = "stale_after: 60\nunhealthy_after: 100\noutlier_detection: false\n"


def config(tmp_path: Path, routing: str) -> str:
    path = tmp_path / "proxy.yaml"
    path.write_text(STEADY + "debug_receipts: true\n" + routing)  # a miss shows its decision
    return str(path)


@pytest.mark.slow
async def test_every_worker_sends_a_session_to_its_home(fleet: SimFleet, tmp_path: Path) -> None:
    expected = homes(fleet)
    async with serve(fleet.urls, "--config", config(tmp_path, UNIFIED)) as served:
        # One request at a time, so the worker that took each is the one whose count rose.
        workers_of: dict[str, set[int]] = {s: set() for s in expected}
        before = await dispatched(served, 0)
        sent = 0
        for turn in range(TURNS):
            for session, want in expected.items():
                await ask(served.url, session, prompt(session, turn), want)
                sent += 1
                after = await dispatched(served, sent)
                (worker,) = [
                    w for w, (a, b) in enumerate(zip(after, before, strict=True)) if a != b
                ]
                workers_of[session].add(worker)
                before = after

        # Then every session at once, each turn on a new connection.
        async def converse(session: str) -> None:
            for turn in range(TURNS, 2 * TURNS):
                await ask(served.url, session, prompt(session, turn), expected[session])

        await asyncio.gather(*(converse(s) for s in expected))
    assert all(n > 0 for n in before), f"one worker served nothing: {before}"
    # With 4 turns on new connections a session is served by both workers 7 times in 8.
    both = [s for s, w in workers_of.items() if w == {0, 1}]
    assert both, workers_of


@pytest.mark.slow
@pytest.mark.parametrize(
    ("routing", "base"), [(UNIFIED, ""), (AUTELLIX, LARGE)], ids=["unified", "autellix"]
)
async def test_two_replicas_send_a_session_to_the_same_home(
    fleet: SimFleet, tmp_path: Path, routing: str, base: str
) -> None:
    expected = homes(fleet)
    path = config(tmp_path, routing)
    async with contextlib.AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(serve(fleet.urls, "--config", path, workers=1))
            for _ in range(2)
        ]
        for turn in range(TURNS):
            for session, want in expected.items():
                replica = replicas[(turn + int(session[1:])) % 2]  # each session meets both
                await ask(replica.url, session, prompt(session, turn, base), want)
        for replica in replicas:
            assert await dispatched(replica, TURNS * SESSIONS // 2) == [TURNS * SESSIONS // 2]
