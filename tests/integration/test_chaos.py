"""Chaos on a simulated fleet: one engine of four fails while a bounded concurrent load of
streamed and non-streamed requests runs through the real proxy, on real loopback sockets.

Every scenario asks the same of the client side: every request answered 200, every stream
ends with one [DONE] and no error event, every answer has exactly `max_tokens` tokens
(`ignore_eos`), and its text equals the same request's answer from an engine nobody faults (the
simulator's output is a function of the prompt, so a moved or retried answer that lost or
repeated text shows). Three engines stay healthy throughout, so there is always capacity.

The proxy's timeouts are short so that recovery is quick, except `read_timeout` (the wait for
a first token), which stays longer than a client waits here: in production it has to cover a
long prompt's prefill, so recovering from a silent backend must not depend on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from proxy.serving.app import FleetProxyApp
from simulator.fleet import SimFleet, start_fleet
from simulator.tokenizer import Tokenizer
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
ENGINES = 4
VICTIM = 1  # the engine that fails; its backend id is e1
CLIENTS = 24
PER_CLIENT = 6  # requests each client sends, one after the other
TOKENS = 40
PROMPTS = 6
# A client gives up on a request after this long; that counts as a failure it saw.
CLIENT_DEADLINE_S = 8.0
PATHS = ("/v1/completions", "/v1/chat/completions")


def _prompt(i: int) -> str:
    return f"Chaos prompt {i}: tell me about the harbour at night and the ships in it."


def _body(path: str, prompt: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": TOKENS, "ignore_eos": True}
    if path == "/v1/completions":
        body["prompt"] = _prompt(prompt)
    else:
        body["messages"] = [{"role": "user", "content": _prompt(prompt)}]
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


@dataclass
class Answer:
    path: str
    stream: bool
    prompt: int
    status: int = 0
    error: str = ""  # what went wrong as the client saw it, "" when nothing did
    text: str = ""
    completion_tokens: int | None = None
    done: int = 0  # [DONE] events
    ids: set[str] = field(default_factory=set)
    legs: int = 1  # backends that served it (from the x-fleet-debug legs note)
    seconds: float = 0.0

    @property
    def kind(self) -> str:
        return f"{self.path.rsplit('/', 1)[-1]}{' stream' if self.stream else ''}"


def _text(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return str(choice["text"] or "")
    part = choice.get("delta") or choice.get("message") or {}
    return str(part.get("content") or "")


async def _read_stream(r: httpx.Response, out: Answer) -> None:
    buf = b""
    parts: list[str] = []
    async for chunk in r.aiter_bytes():
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if event.startswith(b": x-fleet-legs "):
                out.legs = len(orjson.loads(event[len(b": x-fleet-legs ") :]))
                continue
            if not event.startswith(b"data: "):
                continue
            payload = event[6:]
            if payload == b"[DONE]":
                out.done += 1
                continue
            data = orjson.loads(payload)
            if "error" in data:
                out.error = f"error event: {data['error']}"
                continue
            out.ids.add(data["id"])
            parts.extend(_text(c) for c in data.get("choices", []))
            if data.get("usage"):
                out.completion_tokens = data["usage"]["completion_tokens"]
    out.text = "".join(parts)


async def one_request(
    client: httpx.AsyncClient, url: str, path: str, prompt: int, stream: bool
) -> Answer:
    out = Answer(path, stream, prompt)
    body = _body(path, prompt, stream)
    headers = {"x-fleet-debug": "1"}
    started = time.monotonic()
    try:
        async with asyncio.timeout(CLIENT_DEADLINE_S):
            if stream:
                async with client.stream("POST", url + path, json=body, headers=headers) as r:
                    out.status = r.status_code
                    if r.status_code != 200:
                        out.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                        return out
                    await _read_stream(r, out)
            else:
                r = await client.post(url + path, json=body, headers=headers)
                out.status = r.status_code
                if r.status_code != 200:
                    out.error = f"HTTP {r.status_code}: {r.text[:200]}"
                    return out
                data = r.json()
                out.text = _text(data["choices"][0])
                out.completion_tokens = data["usage"]["completion_tokens"]
                out.ids.add(data["id"])
                out.done = 1
                if "x-fleet-legs" in r.headers:
                    out.legs = len(orjson.loads(r.headers["x-fleet-legs"]))
    except TimeoutError:
        out.error = f"no complete answer within {CLIENT_DEADLINE_S:.0f} s"
    except httpx.HTTPError as e:
        out.error = f"{type(e).__name__}: {e}"
    finally:
        out.seconds = time.monotonic() - started
    return out


def _problem(a: Answer, reference: str) -> str:
    """What the client saw go wrong with one request, "" when nothing did."""
    if a.error:
        return a.error
    if a.status != 200:
        return f"HTTP {a.status}"
    if a.done != 1:
        return f"{a.done} [DONE] events"
    if a.completion_tokens != TOKENS:
        return f"{a.completion_tokens} completion tokens, asked {TOKENS}"
    if a.text != reference:
        return f"text differs from the reference ({len(a.text)} chars): {a.text[:80]!r}"
    if len(a.ids) != 1:
        return f"{len(a.ids)} response ids"
    return ""


def problems(answers: list[Answer], refs: dict[tuple[str, int], str]) -> list[str]:
    """Everything the clients saw go wrong, one line per request."""
    out = []
    for a in answers:
        what = _problem(a, refs[(a.path, a.prompt)])
        if what:
            out.append(f"{a.kind} (legs {a.legs}, {a.seconds:.1f} s): {what}")
    return out


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer()


@pytest.fixture
async def fleet(tokenizer: Tokenizer) -> AsyncIterator[SimFleet]:
    async with await start_fleet(ENGINES, tokenizer=tokenizer) as f:
        yield f


async def references(client: httpx.AsyncClient, f: SimFleet) -> dict[tuple[str, int], str]:
    """Each (endpoint, prompt)'s text, straight from an engine nobody faults."""
    keys = [(path, i) for path in PATHS for i in range(PROMPTS)]

    async def ref(path: str, prompt: int) -> str:
        r = await client.post(f.urls[0] + path, json=_body(path, prompt, stream=False))
        assert r.status_code == 200, r.text
        return _text(r.json()["choices"][0])

    texts = await asyncio.gather(*(ref(p, i) for p, i in keys))
    return dict(zip(keys, texts, strict=True))


def proxy_counters(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("fleet_proxy_") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def total(counters: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in counters.items() if k.startswith(prefix))


# The proxy's counters a scenario's report shows.
_NOTED = (
    "fleet_proxy_migrations_total",
    "fleet_proxy_retries_total",
    "fleet_proxy_upstream_errors_total",
    "fleet_proxy_passive_ejections_total",
)


@dataclass
class Run:
    answers: list[Answer]
    counters: dict[str, float]
    refs: dict[tuple[str, int], str]
    seconds: float

    def report(self) -> str:
        moved = sum(a.legs > 1 for a in self.answers)
        slowest = max(a.seconds for a in self.answers)
        return (
            f"{len(self.answers)} requests in {self.seconds:.1f} s, {moved} over 2+ legs, "
            f"slowest {slowest:.2f} s; "
            + ", ".join(f"{k} {v:g}" for k, v in self.counters.items() if k.startswith(_NOTED))
        )


async def chaos(
    f: SimFleet,
    fault: dict[str, Any],
    *,
    clear: dict[str, Any] | None = None,
    **settings: Any,
) -> Run:
    """Run the load, apply `fault` to the victim engine once it serves streams mid-way, undo
    it with `clear` (if given) once the load is over, and return what the clients saw."""
    backends = [{"url": u, "id": f"e{i}"} for i, u in enumerate(f.urls)]
    config = fast_settings(
        backends,
        policy="least_requests",
        # 2 s: on a loaded 2-core machine a healthy engine can pause 1.3 s between tokens,
        # and taking it for stalled ejects the victim before its fault is applied.
        stall_timeout=2.0,
        read_timeout=60.0,
        scrape_timeout=0.3,
        connect_timeout=1.0,
        debug_receipts=True,  # the legs note tells moved requests from the others
        **settings,
    )
    victim = f.engines[VICTIM]
    limits = httpx.Limits(max_connections=CLIENTS + 16)
    async with (
        running_proxy(config) as (url, app),
        httpx.AsyncClient(timeout=30, limits=limits) as client,
    ):
        refs = await references(client, f)
        answers: list[Answer] = []
        failed = asyncio.Event()

        async def worker(c: int) -> None:
            for n in range(PER_CLIENT):
                if failed.is_set():
                    return  # one failure decides the scenario: no need to wait out more
                k = c * PER_CLIENT + n
                path, stream = PATHS[k % 2], (k // 2) % 2 == 0
                answer = await one_request(client, url, path, k % PROMPTS, stream)
                answers.append(answer)
                if answer.error:
                    failed.set()

        started = time.monotonic()
        load = asyncio.gather(*(worker(c) for c in range(CLIENTS)))
        try:
            await eventually(lambda: _streaming_on(app, f"e{VICTIM}") >= 2, within=20)
            r = await client.post(victim.url + "/_sim/faults", json=fault)
            assert r.status_code == 200, r.text
            await asyncio.wait_for(load, timeout=CLIENT_DEADLINE_S * PER_CLIENT + 10)
        finally:
            if not load.done():
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
            if clear is not None and not victim.crashed:
                await client.post(victim.url + "/_sim/faults", json=clear)
        seconds = time.monotonic() - started
        # Nothing is left in flight in the proxy once every client has its answer.
        await eventually(lambda: len(app.core.live) == 0, within=5)
        counters = proxy_counters((await client.get(url + "/metrics")).text)
    assert len(answers) == CLIENTS * PER_CLIENT or any(a.error for a in answers)
    # Every request the proxy abandoned on the victim was aborted there too.
    if not victim.crashed:
        await eventually(lambda: not victim.engine.core.requests, within=5)
    return Run(answers, counters, refs, seconds)


def _streaming_on(app: FleetProxyApp, backend_id: str) -> int:
    """Streams on `backend_id` that have sent tokens to their clients."""
    return sum(
        1
        for r in app.core.live.on_backend(backend_id)
        if r.view()["stream"] and r.view()["tokens_generated"]
    )


def moved_ok(run: Run) -> float:
    return total(run.counters, 'fleet_proxy_migrations_total{outcome="ok"')


# Non-streamed requests assembled from a stream by the proxy can move too.
ASSEMBLED = pytest.mark.parametrize("assembled", [False, True], ids=["plain", "assembled"])


@ASSEMBLED
async def test_an_engine_killed_under_load(fleet: SimFleet, assembled: bool) -> None:
    run = await chaos(fleet, {"crash": True}, assemble_non_streamed=assembled)
    assert problems(run.answers, run.refs) == [], run.report()
    # The streams it held mid-way continued elsewhere.
    assert moved_ok(run) >= 1, run.report()


async def test_an_engine_hung_under_load(fleet: SimFleet) -> None:
    run = await chaos(fleet, {"hang": True}, clear={"hang": False})
    assert problems(run.answers, run.refs) == [], run.report()
    assert moved_ok(run) >= 1, run.report()


async def test_an_engine_answering_500_to_everything(fleet: SimFleet) -> None:
    run = await chaos(fleet, {"error_rate": 1.0}, clear={"error_rate": 0.0})
    assert problems(run.answers, run.refs) == [], run.report()
    # New requests that landed on it were sent again elsewhere.
    errors = run.counters.get('fleet_proxy_upstream_errors_total{backend="e1",kind="status"}', 0)
    assert errors >= 1, run.report()


async def test_an_engine_whose_generation_stalls_while_health_answers(fleet: SimFleet) -> None:
    run = await chaos(fleet, {"stall_generation": True}, clear={"stall_generation": False})
    assert problems(run.answers, run.refs) == [], run.report()
    assert moved_ok(run) >= 1, run.report()


@ASSEMBLED
async def test_an_engine_cutting_every_stream(fleet: SimFleet, assembled: bool) -> None:
    run = await chaos(
        fleet,
        {"cut_stream_after_tokens": TOKENS // 2},
        clear={"cut_stream_after_tokens": None},
        assemble_non_streamed=assembled,
    )
    assert problems(run.answers, run.refs) == [], run.report()
    assert moved_ok(run) >= 1, run.report()


async def test_a_stall_then_failed_health_checks_free_the_requests_waiting_there(
    fleet: SimFleet,
) -> None:
    """A stream's stall ejects the hung engine first (stall_timeout is shorter than two failed
    health checks); the non-streamed request waiting there must still leave it once the health
    checks find it down, as it does when no stall came first."""
    backends = [{"url": u, "id": f"e{i}"} for i, u in enumerate(fleet.urls[:2])]
    config = fast_settings(
        backends,
        policy="round_robin",
        # Under the stall of two failed health checks (0.5 s timeouts), yet long enough that
        # the healthy engine is not taken for stalled on a loaded 2-core machine.
        stall_timeout=0.5,
        scrape_timeout=0.5,
        read_timeout=60,
        outlier_detection=False,  # the health checks alone must free the waiting requests
        # On a loaded machine the healthy engine can be taken for stalled too; the stream
        # must then go on rather than stop as a request that made two engines fail.
        max_backends_failed_in_a_row=0,
    )
    victim_id = ""
    async with running_proxy(config) as (url, app), httpx.AsyncClient(timeout=30) as client:
        try:
            # A long stream, then non-streamed requests until one waits on the same engine.
            body = {**_body(PATHS[0], 0, stream=True), "max_tokens": 4000}

            async def read_all() -> bytes:
                async with client.stream("POST", url + PATHS[0], json=body) as r:
                    return await r.aread()

            streaming = asyncio.ensure_future(read_all())
            await eventually(lambda: any(_streaming_on(app, f"e{i}") for i in range(2)))
            victim_id = next(f"e{i}" for i in range(2) if _streaming_on(app, f"e{i}"))
            plain = {**_body(PATHS[0], 1, stream=False), "max_tokens": 300}
            waiting = [asyncio.ensure_future(client.post(url + PATHS[0], json=plain))]
            waiting.append(asyncio.ensure_future(client.post(url + PATHS[0], json=plain)))
            await eventually(lambda: len(app.core.live.on_backend(victim_id)) == 2)
            victim = fleet.engines[int(victim_id[1:])]
            await client.post(victim.url + "/_sim/faults", json={"hang": True})
            started = time.monotonic()
            # Within a few health checks the victim is found down; its requests leave it.
            done, _ = await asyncio.wait(waiting, timeout=6)
            assert len(done) == 2, f"still waiting after {time.monotonic() - started:.1f} s"
            for task in done:
                assert task.result().status_code == 200
            assert (await streaming).endswith(b"data: [DONE]\n\n")
        finally:
            if victim_id:
                victim = fleet.engines[int(victim_id[1:])]
                await client.post(victim.url + "/_sim/faults", json={"hang": False})
