"""Flow control through real sockets: a simulated engine that runs one request at a time
(max_num_seqs 1), the proxy in front of it saturating as soon as one request waits there.

What is asserted is the order the engine finished requests in (it runs them one by one, in
the order the proxy dispatched them), never how long anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fleet.peer_load import PeerLayout, PeerSegment
from proxy.control.peer_sync import WorkerSeat
from proxy.serving.app import FleetProxyApp
from simulator.fleet import DEFAULT_MODEL, SimFleet, start_fleet
from simulator.profiles import DEFAULT_PROFILE, load_profile
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

pytestmark = pytest.mark.slow

FLOW: dict[str, Any] = {
    "saturation": {"queue_depth_threshold": 1},
    "objectives": {"critical": 10, "batch": -1},
}


@pytest.fixture
async def one_at_a_time() -> AsyncIterator[SimFleet]:
    profile = load_profile(DEFAULT_PROFILE).with_overrides(max_num_seqs=1)
    async with await start_fleet(1, profile=profile, speed=4.0) as f:
        yield f


def body(max_tokens: int = 4) -> dict[str, Any]:
    return {
        "model": DEFAULT_MODEL,
        "prompt": "Tell me about the morning light.",
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


def queued(app: FleetProxyApp) -> int:
    assert app.flow is not None
    pool = app.flow.pools.get(DEFAULT_MODEL)
    return pool.count if pool is not None else 0


def engine_running(app: FleetProxyApp) -> float:
    snap = next(iter(app.core.fleet)).snapshot
    return snap.metrics.running if snap is not None else 0.0


def engine_waiting(f: SimFleet) -> int:
    return len(f.engines[0].engine.core.waiting)


class Finishes:
    """The labels of requests in the order their answers came back."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.order: list[str] = []
        self.tasks: list[asyncio.Task[httpx.Response]] = []

    def send(
        self, label: str, headers: dict[str, str], request: dict[str, Any] | None = None
    ) -> None:
        async def one() -> httpx.Response:
            json = request if request is not None else body()
            r = await self.client.post("/v1/completions", json=json, headers=headers)
            self.order.append(label)
            return r

        self.tasks.append(asyncio.create_task(one()))

    async def all(self) -> list[httpx.Response]:
        return list(await asyncio.gather(*self.tasks))


async def blocker(client: httpx.AsyncClient, app: FleetProxyApp) -> asyncio.Task[httpx.Response]:
    """A long request running on the engine until cancelled (its client leaving aborts it)."""
    task = asyncio.create_task(client.post("/v1/completions", json=body(100_000)))
    await eventually(lambda: engine_running(app) == 1, what="the blocker running")
    return task


async def release(task: asyncio.Task[httpx.Response]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class Scene:
    """A proxy with flow control in front of the engine, a client, and the blocker running."""

    def __init__(self, app: FleetProxyApp, client: httpx.AsyncClient, held: Any) -> None:
        self.app = app
        self.client = client
        self.held: asyncio.Task[httpx.Response] = held
        self.finishes = Finishes(client)


@contextlib.asynccontextmanager
async def saturated(fleet: SimFleet, **settings: Any) -> AsyncIterator[Scene]:
    """With `api_keys`, the blocker sends the first key."""
    flow = settings.pop("flow_control", FLOW)
    keys = settings.get("api_keys")
    auth = {} if not keys else {"authorization": f"Bearer {keys[0]['key']}"}
    async with (
        running_proxy(fast_settings(fleet.urls, flow_control=flow, **settings)) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=60) as c,
        httpx.AsyncClient(base_url=url, timeout=60, headers=auth) as blocking,
    ):
        yield Scene(app, c, await blocker(blocking, app))


class TwoWorkers:
    """Two proxies on one shared segment, as `fleet-proxy serve --workers 2` runs them, and
    a client of each."""

    def __init__(self, apps: list[FleetProxyApp], clients: list[httpx.AsyncClient]) -> None:
        self.apps = apps
        self.clients = clients

    async def full_to(self, worker: int) -> None:
        """Until `worker` sees the pool full: its scrapes and the other's load reach it on
        their own clocks, later on a loaded machine."""
        app = self.apps[worker]
        assert app.flow is not None
        flow = app.flow
        await eventually(
            lambda: flow.saturation(DEFAULT_MODEL, app.core.clock.now()) >= 1.0,
            what=f"worker {worker} seeing the pool full",
        )


@contextlib.asynccontextmanager
async def two_workers(fleet: SimFleet, tmp_path: Path, flow: Any) -> AsyncIterator[TwoWorkers]:
    segment = PeerSegment(PeerLayout(workers=2, slots=8))
    seats = [WorkerSeat(w, 2, segment.name, str(tmp_path / "changes.jsonl")) for w in (0, 1)]
    settings = fast_settings(fleet.urls, flow_control=flow)
    try:
        async with (
            running_proxy(settings, seat=seats[0]) as (url0, app0),
            running_proxy(settings, seat=seats[1]) as (url1, app1),
            httpx.AsyncClient(base_url=url0, timeout=120) as c0,
            httpx.AsyncClient(base_url=url1, timeout=120) as c1,
        ):
            yield TwoWorkers([app0, app1], [c0, c1])
    finally:
        segment.close()


async def preemptions(client: httpx.AsyncClient, reason: str) -> float | None:
    """The proxy's preemption counter for the model, for `reason`."""
    metrics = (await client.get("/metrics")).text
    name = "fleet_proxy_flow_control_preemptions_total"
    return metric(metrics, f'{name}{{model_name="{DEFAULT_MODEL}",reason="{reason}"}}')


def metric(text: str, line_start: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return None


async def test_a_high_priority_request_dispatches_before_queued_sheddable_ones(one_at_a_time):
    async with saturated(one_at_a_time) as scene:
        app, c, held, f = scene.app, scene.client, scene.held, scene.finishes
        for i in range(4):
            f.send(f"batch{i}", {"x-gateway-inference-objective": "batch"})
            if i == 0:  # the first goes on to wait at the engine: the pool is saturated
                await eventually(lambda: engine_waiting(one_at_a_time) == 1)
        await eventually(lambda: queued(app) == 3, what="three sheddable requests queued")
        f.send("critical", {"x-gateway-inference-objective": "critical"})
        await eventually(lambda: queued(app) == 4, what="the critical request queued")
        await release(held)
        answers = await f.all()
        assert [r.status_code for r in answers] == [200] * 5
        # batch0 was at the engine already; the critical one overtook the queued batch ones.
        assert f.order == ["batch0", "critical", "batch1", "batch2", "batch3"]
        metrics = (await c.get("/metrics")).text
        assert (
            metric(
                metrics,
                "llm_d_epp_flow_control_request_queue_duration_seconds_count"
                f'{{model_name="{DEFAULT_MODEL}",outcome="Dispatched",priority="10"}}',
            )
            == 1
        )


async def test_a_higher_band_queued_in_another_worker_takes_the_room_first(
    one_at_a_time, tmp_path: Path
):
    """Two workers: sheddable requests queue in worker 0, critical ones in worker 1; when the
    engine frees, the critical ones go first, although worker 0's requests were queued
    earlier."""
    async with two_workers(one_at_a_time, tmp_path, FLOW) as workers:
        order = await queued_in_both_workers(
            one_at_a_time,
            workers,
            ("batch", {"x-gateway-inference-objective": "batch"}),
            ("critical", {"x-gateway-inference-objective": "critical"}),
        )
        assert order == ["batch0", "critical0", "critical1", "batch1", "batch2", "batch3"]


async def queued_in_both_workers(
    fleet: SimFleet,
    workers: TwoWorkers,
    first: tuple[str, dict[str, str]],
    then: tuple[str, dict[str, str]],
) -> list[str]:
    """Worker 0 holds the engine with a blocker and sends four requests (label and headers
    `first`): the first waits in the engine, three queue; then two (`then`) queue in worker
    1. Once each worker sees the other's queue, the blocker is released. Every request is
    answered; the order they finished in."""
    (app0, app1), (c0, c1) = workers.apps, workers.clients
    held = await blocker(c0, app0)
    f0, f1 = Finishes(c0), Finishes(c1)
    f1.order = f0.order  # one record of the order, whichever worker answered
    for i in range(4):
        f0.send(f"{first[0]}{i}", first[1])
        if i == 0:
            await eventually(lambda: engine_waiting(fleet) == 1)
    await eventually(lambda: queued(app0) == 3, what=f"three {first[0]} requests queued")
    await workers.full_to(1)
    for i in range(2):
        f1.send(f"{then[0]}{i}", then[1])
    await eventually(lambda: queued(app1) == 2, what=f"the {then[0]} requests queued")

    async def published() -> bool:
        assert app0.flow is not None
        return bool(app0.flow.workers_waiting() == {0: 3, 1: 2})

    await eventually(published, what="each worker seeing the other's queue")
    await release(held)
    answers = [*await f0.all(), *await f1.all()]
    assert [r.status_code for r in answers] == [200] * 6
    return f0.order


async def test_a_responses_request_queues_and_goes_by_its_priority(one_at_a_time, tmp_path: Path):
    """The Responses API is flow-controlled as chat is: a critical response overtakes queued
    sheddable completions, and its priority and wait reach its request log line."""
    log = tmp_path / "requests.jsonl"
    async with saturated(one_at_a_time, request_log="json", request_log_file=log) as scene:
        app, c, held, f = scene.app, scene.client, scene.held, scene.finishes
        for i in range(3):
            # Longer than the response, whose answer the proxy also stores before it returns.
            f.send(f"batch{i}", {"x-gateway-inference-objective": "batch"}, body(32))
            if i == 0:
                await eventually(lambda: engine_waiting(one_at_a_time) == 1)
        await eventually(lambda: queued(app) == 2, what="two sheddable requests queued")

        async def respond() -> httpx.Response:
            r = await c.post(
                "/v1/responses",
                json={"model": DEFAULT_MODEL, "input": "Hello there.", "max_output_tokens": 4},
                headers={"x-gateway-inference-objective": "critical"},
            )
            f.order.append("response")
            return r

        f.tasks.append(asyncio.create_task(respond()))
        await eventually(lambda: queued(app) == 3, what="the response queued")
        await release(held)
        answers = await f.all()
        assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
        answer = answers[-1].json()
        assert answer["object"] == "response" and answer["output"], answer  # 4 tokens: incomplete
        assert f.order == ["batch0", "response", "batch1", "batch2"]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    (response,) = [e for e in lines if e["endpoint"] == "responses"]
    assert response["priority"] == 10 and response["queue_wait_ms"] > 0


async def test_a_noisy_tenant_does_not_starve_a_quiet_one(one_at_a_time, tmp_path: Path):
    log = tmp_path / "requests.jsonl"
    async with saturated(one_at_a_time, request_log="json", request_log_file=log) as scene:
        app, c, held, f = scene.app, scene.client, scene.held, scene.finishes
        f.send("noisy0", {"x-gateway-fairness-id": "noisy"})
        await eventually(lambda: engine_waiting(one_at_a_time) == 1)
        for i in range(1, 7):
            f.send(f"noisy{i}", {"x-gateway-fairness-id": "noisy"})
        await eventually(lambda: queued(app) == 6, what="the noisy tenant's requests queued")
        for i in range(2):
            f.send(f"quiet{i}", {"x-gateway-fairness-id": "quiet"})
        await eventually(lambda: queued(app) == 8, what="the quiet tenant's requests queued")
        view = (await c.get("/admin/flow")).json()
        tenants = view["pools"][DEFAULT_MODEL]["bands"][0]["tenants"]
        assert {t: v["waiting"] for t, v in tenants.items()} == {"noisy": 6, "quiet": 2}
        await release(held)
        await f.all()
        # Round robin: a request from each tenant in turn, not the quiet one after all six.
        assert f.order[:5] == ["noisy0", "noisy1", "quiet0", "noisy2", "quiet1"]

    # The request log names each request's tenant, priority and time queued.
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    served = [e for e in lines if e["status"] == 200]
    assert sorted(e["tenant"] for e in served) == ["noisy"] * 7 + ["quiet"] * 2
    assert all(e["priority"] == 0 and e["queue_wait_ms"] >= 0 for e in served)


async def test_token_weighted_fairness_counts_prompt_tokens_not_requests(one_at_a_time):
    flow = {**FLOW, "fairness": "token_weighted"}
    long_prompt = {**body(), "prompt": "A long document to summarise. " * 250}  # ~7.5k chars
    async with saturated(one_at_a_time, flow_control=flow) as scene:
        app, f = scene.app, scene.finishes
        big = {"x-gateway-fairness-id": "big"}
        small = {"x-gateway-fairness-id": "small"}
        f.send("big0", big, long_prompt)
        await eventually(lambda: engine_waiting(one_at_a_time) == 1)
        for i in range(1, 4):
            f.send(f"big{i}", big, long_prompt)
        await eventually(lambda: queued(app) == 3, what="the big prompts queued")
        for i in range(4):
            f.send(f"small{i}", small)
        await eventually(lambda: queued(app) == 7, what="the small prompts queued")
        await release(scene.held)
        assert [r.status_code for r in await f.all()] == [200] * 8
        # One big prompt weighs more than all the small ones: they all pass before the next.
        # (Round robin would alternate: big1, small0, big2, small1, ...)
        assert f.order == [
            "big0", "big1", "small0", "small1", "small2", "small3", "big2", "big3",
        ]  # fmt: skip


async def test_a_queued_client_that_leaves_is_removed_at_once(one_at_a_time):
    waiting = f'fleet_proxy_flow_control_waiting{{model_name="{DEFAULT_MODEL}"}}'
    async with saturated(one_at_a_time) as scene:
        app, c, held, f = scene.app, scene.client, scene.held, scene.finishes
        url = str(c.base_url)
        f.send("at-engine", {})
        await eventually(lambda: engine_waiting(one_at_a_time) == 1)
        async with httpx.AsyncClient(base_url=url, timeout=60) as leaving:
            gone = asyncio.create_task(leaving.post("/v1/completions", json=body()))
            await eventually(lambda: queued(app) == 1, what="one request queued")
            assert metric((await c.get("/metrics")).text, waiting) == 1
            # Only generation waits: a tokenize request is served at once.
            tokenized = await c.post("/tokenize", json={"model": DEFAULT_MODEL, "prompt": "hi"})
            assert tokenized.status_code == 200 and queued(app) == 1
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone

        async def gauge() -> float | None:
            return metric((await c.get("/metrics")).text, waiting)

        await eventually(lambda: queued(app) == 0, what="the queue empty")
        assert await gauge() == 0
        metrics = (await c.get("/metrics")).text
        assert "llm_d_epp_flow_control_queue_size{" not in metrics  # no tenant waiting
        await release(held)
        assert [r.status_code for r in await f.all()] == [200]


async def test_past_its_ttl_a_sheddable_request_gets_429_and_a_normal_one_503(one_at_a_time):
    flow = {
        **FLOW,
        "bands": {-1: {"queue_ttl": 0.2}, 0: {"queue_ttl": 0.2}},
        "rate_limits": {"default": {"requests_per_minute": 100}},
    }
    async with saturated(one_at_a_time, flow_control=flow) as scene:
        held, url = scene.held, str(scene.client.base_url).rstrip("/")
        sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        at_engine = asyncio.create_task(
            sdk.completions.create(model=DEFAULT_MODEL, prompt="hi", max_tokens=2)
        )
        await eventually(lambda: engine_waiting(one_at_a_time) == 1)
        with pytest.raises(openai.RateLimitError) as shed:
            await sdk.completions.create(
                model=DEFAULT_MODEL,
                prompt="hi",
                max_tokens=2,
                extra_headers={"x-gateway-inference-objective": "batch"},
            )
        assert shed.value.response.headers["retry-after"] == "1"
        assert shed.value.code == "ttl_expired"
        # A rate-limited tenant's refusal is an answer too: it tells the quota.
        assert shed.value.response.headers["x-ratelimit-limit-requests"] == "100"
        with pytest.raises(openai.InternalServerError) as unavailable:
            await sdk.completions.create(model=DEFAULT_MODEL, prompt="hi", max_tokens=2)
        assert unavailable.value.status_code == 503
        assert unavailable.value.code == "ttl_expired"
        assert unavailable.value.response.headers["x-ratelimit-limit-requests"] == "100"
        await release(held)
        assert (await at_engine).choices
        await sdk.close()


async def test_off_by_default(one_at_a_time):
    async with running_proxy(fast_settings(one_at_a_time.urls)) as (_, app):
        assert app.flow is None


async def test_the_tenant_an_api_key_names_wins_over_the_header(one_at_a_time):
    keys = [{"key": "team-a-key", "tenant": "team-a"}, "plain-key"]
    async with saturated(one_at_a_time, api_keys=keys) as scene:
        app, c, f = scene.app, scene.client, scene.finishes
        as_a = {"authorization": "Bearer team-a-key", "x-gateway-fairness-id": "someone-else"}
        plain = {"authorization": "Bearer plain-key", "x-gateway-fairness-id": "team-b"}
        f.send("first", as_a)
        await eventually(lambda: engine_waiting(one_at_a_time) == 1)
        f.send("a", as_a)
        f.send("b", plain)
        await eventually(lambda: queued(app) == 2, what="two requests queued")
        view = (await c.get("/admin/flow")).json()
        assert view["enabled"] and view["fairness"] == "round_robin"
        tenants = view["pools"][DEFAULT_MODEL]["bands"][0]["tenants"]
        assert sorted(tenants) == ["team-a", "team-b"]
        await release(scene.held)
        assert [r.status_code for r in await f.all()] == [200, 200, 200]


async def read_stream(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    headers: dict[str, str],
    on_event: Any = None,
    after: int = 5,
) -> tuple[str, list[dict[str, Any]]]:
    """A streamed completion's text and its events; `on_event()` is awaited once `after`
    events came."""
    text: list[str] = []
    events: list[dict[str, Any]] = []
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            events.append(event)
            text += [c.get("text") or "" for c in event.get("choices", [])]
            if on_event is not None and len(events) == after:
                await on_event()
    return "".join(text), events


# Any request on the engine fills the pool (its KV cache is over a tiny threshold), so the
# critical request queues while the sheddable stream runs.
PREEMPTING = {
    **FLOW,
    "preemption": True,
    "saturation": {"queue_depth_threshold": 1, "kv_cache_util_threshold": 1e-6},
}


async def suspended_and_resumed(
    streams: httpx.AsyncClient,
    worker: FleetProxyApp,
    critical_client: httpx.AsyncClient,
    full: Callable[[], Awaitable[None]],
) -> None:
    """A sheddable stream sent through `streams` is suspended for a critical request sent
    through `critical_client` once `full()` returns, and resumes token-exact after it is
    answered; `worker`, the stream's, counts one preemption."""
    long_body = {**body(300), "stream": True}
    batch = {"x-gateway-inference-objective": "batch"}
    critical = {"x-gateway-inference-objective": "critical"}
    reference, _ = await read_stream(streams, long_body, batch)  # alone: never suspended
    await eventually(lambda: engine_running(worker) == 0, what="the engine idle again")
    others: list[asyncio.Task[httpx.Response]] = []

    async def crowd_in() -> None:
        await full()
        others.append(
            asyncio.create_task(
                critical_client.post("/v1/completions", json=body(), headers=critical)
            )
        )

    text, events = await read_stream(streams, long_body, batch, crowd_in)
    assert others[0].done()  # answered before the stream resumed
    assert others[0].result().status_code == 200
    assert not [e for e in events if "error" in e]
    assert text == reference
    assert await preemptions(streams, "priority") == 1


async def test_preemption_suspends_a_sheddable_stream_and_resumes_it_token_exact(
    one_at_a_time,
):
    settings = fast_settings(one_at_a_time.urls, flow_control=PREEMPTING)
    async with (
        running_proxy(settings) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=120) as c,
    ):

        async def stream_scraped() -> None:
            await eventually(lambda: engine_running(app) == 1, what="a scrape of the stream")

        await suspended_and_resumed(c, app, c, stream_scraped)


async def test_a_critical_request_in_one_worker_preempts_a_stream_of_another(
    one_at_a_time, tmp_path: Path
):
    """Two workers: worker 0 let a sheddable stream through, a critical request queues in
    worker 1; worker 0 suspends its stream for it, and the stream resumes token-exact once
    the critical request is answered."""
    async with two_workers(one_at_a_time, tmp_path, PREEMPTING) as workers:
        (app0, _), (c0, c1) = workers.apps, workers.clients
        await suspended_and_resumed(c0, app0, c1, lambda: workers.full_to(1))


@pytest.fixture
async def two_seats() -> AsyncIterator[SimFleet]:
    profile = load_profile(DEFAULT_PROFILE).with_overrides(max_num_seqs=2)
    async with await start_fleet(1, profile=profile, speed=4.0) as f:
        yield f


FAIR_SHARE: dict[str, Any] = {"saturation": {"max_num_seqs": 2}, "fair_share_preemption": True}


async def test_with_the_seats_known_requests_wait_in_the_proxy_not_the_engine(two_seats):
    async with (
        running_proxy(fast_settings(two_seats.urls, flow_control=FAIR_SHARE)) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=120) as c,
    ):
        long = [asyncio.create_task(c.post("/v1/completions", json=body(100_000))) for _ in "ab"]
        await eventually(lambda: engine_running(app) == 2, what="both seats taken")
        f = Finishes(c)
        for label in "xyz":
            f.send(label, {})
        await eventually(lambda: queued(app) == 3, what="three requests queued in the proxy")
        assert engine_waiting(two_seats) == 0
        for task in long:
            await release(task)
        assert [r.status_code for r in await f.all()] == [200, 200, 200]
        assert f.order == ["x", "y", "z"]


async def test_a_seat_kept_free_lets_a_tenant_running_nothing_start_without_a_suspension(
    two_seats,
):
    """One of the engine's two seats kept (`fair_share_reserved_seats: 1`): `noisy`'s second
    request waits in the proxy beside a free seat, which `quiet` then takes at once; no stream
    is suspended, and `noisy`'s request goes when its first ends."""
    flow = {**FAIR_SHARE, "fair_share_reserved_seats": 1}
    engine = two_seats.engines[0].engine.core
    async with (
        running_proxy(fast_settings(two_seats.urls, flow_control=flow)) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=120) as c,
    ):
        first = asyncio.create_task(c.post("/v1/completions", json=body(100_000), headers=NOISY))
        await eventually(lambda: engine_running(app) == 1, what="noisy's first request running")
        second = asyncio.create_task(c.post("/v1/completions", json=body(), headers=NOISY))
        await eventually(lambda: queued(app) == 1, what="noisy's second request held back")
        answer = await c.post("/v1/completions", json=body(), headers=QUIET)
        assert answer.status_code == 200
        assert len(engine.running) == 1 and engine_waiting(two_seats) == 0
        assert not second.done() and queued(app) == 1  # the kept seat is free again
        assert not await preemptions(c, "fair_share")
        await release(first)
        assert (await second).status_code == 200


async def seat_taken_for_a_poorer_tenant(
    streams: httpx.AsyncClient,
    worker: FleetProxyApp,
    quiet_client: httpx.AsyncClient,
    full: Callable[[], Awaitable[None]],
) -> None:
    """Tenant `noisy` runs two streams through `streams` on the engine's two seats; tenant
    `quiet` asks through `quiet_client` once `full()` returns. The later stream is
    suspended, `quiet` is answered while it waits, and it resumes token-exact; `worker`, the
    streams', counts one fair-share preemption."""
    noisy = {"x-gateway-fairness-id": "noisy"}
    quiet = {"x-gateway-fairness-id": "quiet"}
    long_body = {**body(300), "stream": True}
    reference, _ = await read_stream(streams, long_body, noisy)  # alone: never suspended
    await eventually(lambda: engine_running(worker) == 0, what="the engine idle again")
    first = asyncio.create_task(streams.post("/v1/completions", json=body(100_000), headers=noisy))
    await eventually(lambda: engine_running(worker) == 1, what="the first stream running")
    answered: list[httpx.Response] = []

    async def quiet_asks() -> None:
        await eventually(lambda: engine_running(worker) == 2, what="both seats taken")
        await full()
        answered.append(await quiet_client.post("/v1/completions", json=body(), headers=quiet))

    text, events = await read_stream(streams, long_body, noisy, quiet_asks)
    assert [r.status_code for r in answered] == [200]  # while the stream was suspended
    assert not [e for e in events if "error" in e]
    assert text == reference
    assert not first.done()  # the earlier stream kept its seat throughout
    await release(first)
    assert await preemptions(streams, "fair_share") == 1


async def test_a_tenant_below_its_share_takes_a_seat_and_the_stream_resumes_token_exact(
    two_seats,
):
    async with (
        running_proxy(fast_settings(two_seats.urls, flow_control=FAIR_SHARE)) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=120) as c,
    ):

        async def seats_taken() -> None:
            pass  # one proxy: it sees the seats it filled

        await seat_taken_for_a_poorer_tenant(c, app, c, seats_taken)


async def test_a_dispatched_request_is_routed_to_the_backend_with_room():
    """Two one-seat engines and round robin: the request dispatched when one frees goes
    there, not to the engine round robin's turn names (busy with a long request)."""
    profile = load_profile(DEFAULT_PROFILE).with_overrides(max_num_seqs=1)
    flow = {"saturation": {"max_num_seqs": 1}}
    async with (
        await start_fleet(2, profile=profile, speed=4.0) as fleet,
        running_proxy(fast_settings(fleet.urls, flow_control=flow, policy="round_robin")) as (
            url,
            app,
        ),
        httpx.AsyncClient(base_url=url, timeout=120) as c,
    ):

        def running() -> float:
            return sum(b.snapshot.metrics.running for b in app.core.fleet if b.snapshot)

        kept = asyncio.create_task(c.post("/v1/completions", json=body(100_000)))
        await eventually(lambda: running() == 1, what="the first long request running")
        freed = asyncio.create_task(c.post("/v1/completions", json=body(100_000)))
        await eventually(lambda: running() == 2, what="both engines busy")
        queued_one = asyncio.create_task(c.post("/v1/completions", json=body()))
        await eventually(lambda: queued(app) == 1, what="the third request queued")
        await release(freed)
        done, _ = await asyncio.wait([queued_one], timeout=60)
        assert done, "the dispatched request went to the engine still busy"
        assert queued_one.result().status_code == 200
        assert not kept.done()
        await release(kept)


async def test_a_tenant_waiting_in_one_worker_takes_a_seat_from_one_running_in_another(
    two_seats, tmp_path: Path
):
    """Two workers: `noisy` runs through worker 0, `quiet` asks through worker 1. Worker 0
    suspends its later stream and leaves the freed seat to worker 1's waiting tenant (it
    runs fewer in the whole proxy)."""
    async with two_workers(two_seats, tmp_path, FAIR_SHARE) as workers:
        (app0, _), (c0, c1) = workers.apps, workers.clients
        await seat_taken_for_a_poorer_tenant(c0, app0, c1, lambda: workers.full_to(1))


# Long enough that nothing a test sees fades measurably, however slow the machine.
WHOLE_PROXY = {**FLOW, "fairness_memory": 600}
NOISY = {"x-gateway-fairness-id": "noisy"}
QUIET = {"x-gateway-fairness-id": "quiet"}


async def noisy_behind_a_blocker(
    fleet: SimFleet, app: FleetProxyApp, client: httpx.AsyncClient
) -> tuple[asyncio.Task[httpx.Response], Finishes]:
    """The blocker on the engine, `noisy0` waiting in the engine behind it, `noisy1` and
    `noisy2` queued in `app`: the blocker's task and the noisy requests' record."""
    held = await blocker(client, app)
    f = Finishes(client)
    f.send("noisy0", NOISY)
    await eventually(lambda: engine_waiting(fleet) == 1)
    for i in (1, 2):
        f.send(f"noisy{i}", NOISY)
    await eventually(lambda: queued(app) == 2, what="two of noisy's requests queued")
    return held, f


async def served_lately(client: httpx.AsyncClient, tenant: str) -> float:
    """What the whole proxy served `tenant` lately, as the worker `client` reaches sees it."""
    view = (await client.get("/admin/flow")).json()
    return float(view["served_lately"].get(DEFAULT_MODEL, {}).get("0", {}).get(tenant, 0.0))


async def test_with_two_workers_fairness_counts_what_the_whole_proxy_served(
    one_at_a_time, tmp_path: Path
):
    """Two workers: `noisy` was served four requests through worker 1, then both tenants
    queue in worker 0. Worker 0 serves `quiet` first: counting only its own dispatches, round
    robin would alternate from `noisy`, whose queue formed first."""
    async with two_workers(one_at_a_time, tmp_path, WHOLE_PROXY) as workers:
        (app0, _), (c0, c1) = workers.apps, workers.clients
        for _ in range(4):  # one at a time: the pool never saturates, each passes at once
            r = await c1.post("/v1/completions", json=body(), headers=NOISY)
            assert r.status_code == 200
        held, f = await noisy_behind_a_blocker(one_at_a_time, app0, c0)
        for i in (0, 1):
            f.send(f"quiet{i}", QUIET)
        await eventually(lambda: queued(app0) == 4, what="the quiet tenant's requests queued")

        async def worker_1s_service_seen() -> bool:
            return await served_lately(c0, "noisy") >= 4.9  # 4 there, noisy0 here

        await eventually(worker_1s_service_seen, what="worker 1's service reaching worker 0")
        assert await served_lately(c0, "quiet") == 0.0
        await release(held)
        assert [r.status_code for r in await f.all()] == [200] * 5
        assert f.order == ["noisy0", "quiet0", "quiet1", "noisy1", "noisy2"]


async def test_a_tenant_served_less_waiting_in_another_worker_takes_the_room_first(
    one_at_a_time, tmp_path: Path
):
    """Two workers: `noisy` queues in worker 0, `quiet` (served nothing yet) in worker 1.
    When the engine frees, worker 0 leaves the room to worker 1's tenant; from then on the
    two take turns (a tie lets either go)."""
    async with two_workers(one_at_a_time, tmp_path, WHOLE_PROXY) as workers:
        order = await queued_in_both_workers(
            one_at_a_time, workers, ("noisy", NOISY), ("quiet", QUIET)
        )
        assert order[:2] == ["noisy0", "quiet0"], order
        assert "quiet1" in order[2:4], order


async def test_with_two_workers_a_tenants_queue_limit_holds_for_the_whole_proxy(
    one_at_a_time, tmp_path: Path
):
    """`tenant_capacity: 2`: two of `noisy`'s requests wait in worker 0, so worker 1 refuses
    its third (503 `tenant_full`) and still queues another tenant's."""
    flow = {**WHOLE_PROXY, "tenant_capacity": 2}
    async with two_workers(one_at_a_time, tmp_path, flow) as workers:
        (app0, app1), (c0, c1) = workers.apps, workers.clients
        assert app1.flow is not None
        gate1 = app1.flow
        held, f = await noisy_behind_a_blocker(one_at_a_time, app0, c0)
        await workers.full_to(1)
        await eventually(
            lambda: gate1.waiting_elsewhere(DEFAULT_MODEL, 0, "noisy") == (2, 2),
            what="worker 1 seeing worker 0's queue",
        )
        refused = await c1.post("/v1/completions", json=body(), headers=NOISY)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "tenant_full"
        assert refused.headers["retry-after"] == "1"
        f1 = Finishes(c1)
        f1.send("quiet0", QUIET)
        await eventually(lambda: queued(app1) == 1, what="another tenant's request queued")
        await release(held)
        answers = [*await f.all(), *await f1.all()]
        assert [r.status_code for r in answers] == [200] * 4
