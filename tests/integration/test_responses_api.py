"""The Responses API through the proxy on simulated engines, with the official `openai` SDK:
responses created whole and streamed, retrieved, deleted, run in the background and
cancelled, threads continued by `previous_response_id` on whichever engine the policy picks
(no engine keeps a thread: the proxy sends each one its whole history), and each API key
seeing only its own responses."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any

import httpx
import openai
import pytest

from simulator.fleet import DEFAULT_PROFILE, SimFleet, start_fleet
from simulator.profiles import load_profile
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(3, speed=20.0) as f:
        yield f


def client(url: str, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def idle(f: SimFleet) -> bool:
    return all(not s.engine.core.running and not s.engine.core.waiting for s in f.engines)


async def test_a_response_is_created_retrieved_and_deleted(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        c = client(url)
        made = await c.responses.create(model=MODEL, input="Hello there", max_output_tokens=6)
        assert made.id.startswith("resp_") and made.object == "response"
        assert made.output_text and made.usage is not None and made.usage.output_tokens == 6
        assert made.store is True and made.previous_response_id is None
        got = await c.responses.retrieve(made.id)
        assert got.id == made.id and got.output_text == made.output_text
        await c.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await c.responses.delete(made.id)
        await c.close()


async def test_a_streamed_response_is_stored_and_continued(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        c = client(url)
        stream = await c.responses.create(
            model=MODEL, input="Tell me a story", max_output_tokens=8, stream=True
        )
        kinds: list[str] = []
        text: list[str] = []
        ids: set[str] = set()
        final: Any = None
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text.append(event.delta)
            response = getattr(event, "response", None)
            if response is not None:
                ids.add(response.id)
                final = response
        assert kinds[0] == "response.created" and kinds[-1] in (
            "response.completed",
            "response.incomplete",
        )
        assert len(ids) == 1  # the proxy's id on every response object of the stream
        assert final.output_text == "".join(text)
        stored = await c.responses.retrieve(final.id)
        assert stored.output_text == final.output_text
        # The streamed answer continues a thread at once: it was stored before its last event.
        follow = await c.responses.create(
            model=MODEL, input="And then?", previous_response_id=final.id, max_output_tokens=4
        )
        assert follow.previous_response_id == final.id
        assert follow.usage is not None and final.usage is not None
        assert follow.usage.input_tokens > final.usage.input_tokens + final.usage.output_tokens
        await c.close()


async def thread_of(c: openai.AsyncOpenAI, turns: int, opening: str = "") -> list[tuple[Any, str]]:
    """`turns` responses, each continuing the one before; with the backend each came from."""
    out: list[tuple[Any, str]] = []
    previous: str | None = None
    for i in range(turns):
        raw = await c.responses.with_raw_response.create(
            model=MODEL,
            input=(opening if i == 0 else "") + f"Turn {i}: what comes next?",
            max_output_tokens=5,
            **({"previous_response_id": previous} if previous else {}),
        )
        made = raw.parse()
        assert made.previous_response_id == previous
        out.append((made, raw.headers["x-fleet-backend"]))
        previous = made.id
    return out


def assert_whole_history(thread: list[tuple[Any, str]]) -> None:
    """Each turn's engine read every earlier turn, its input and its answer, then its own."""
    for (before, _), (after, _) in pairwise(thread):
        assert after.usage.input_tokens > before.usage.input_tokens + before.usage.output_tokens


async def test_a_thread_spread_over_three_engines_sends_each_its_whole_history(
    fleet: SimFleet,
) -> None:
    settings = fast_settings(fleet.urls, policy="round_robin", backend_header=True)
    async with running_proxy(settings) as (url, _):
        c = client(url)
        thread = await thread_of(c, 5)
        assert len({backend for _, backend in thread}) == 3
        assert_whole_history(thread)
        await c.close()


async def test_a_thread_goes_on_while_an_engine_restarts(fleet: SimFleet) -> None:
    settings = fast_settings(fleet.urls, policy="round_robin", backend_header=True)
    restarted = fleet.engines[0].url.removeprefix("http://")
    async with running_proxy(settings) as (url, app):
        c = client(url)
        thread = await thread_of(c, 2)
        await fleet.engines[0].crash()  # its KV cache and requests are gone
        previous = thread[-1][0].id

        async def turn(i: int) -> str:
            nonlocal previous
            raw = await c.responses.with_raw_response.create(
                model=MODEL, input=f"More {i}", previous_response_id=previous, max_output_tokens=5
            )
            made = raw.parse()
            assert made.status in ("completed", "incomplete") and made.output_text
            thread.append((made, raw.headers["x-fleet-backend"]))
            previous = made.id
            return raw.headers["x-fleet-backend"]

        for i in range(3):  # the dead engine's turn goes elsewhere
            assert await turn(i) != restarted
        await fleet.engines[0].recover()  # back, empty, on the same port

        def routable() -> bool:
            return len(app.core.fleet.routable(app.core.clock.now())) == 3

        await eventually(routable, within=30, what="the restarted engine routable again")
        served = [await turn(i) for i in range(3, 6)]
        assert restarted in served  # an engine that knew nothing of the thread continued it
        assert_whole_history(thread)
        await c.close()


async def test_a_background_response_runs_and_is_retrieved(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        c = client(url)
        queued = await c.responses.create(
            model=MODEL, input="Work on this", max_output_tokens=6, background=True
        )
        assert queued.status in ("queued", "in_progress") and queued.background is True

        async def finished() -> Any:
            got = await c.responses.retrieve(queued.id)
            return got if got.status not in ("queued", "in_progress") else None

        done = await eventually(finished, within=30, what="the background response done")
        assert done.id == queued.id and done.output_text
        assert done.usage is not None and done.usage.output_tokens == 6
        await c.close()


async def test_a_background_response_is_cancelled() -> None:
    # One engine at real speed: the response takes far longer than its cancellation.
    async with (
        await start_fleet(1, speed=1.0) as fleet,
        running_proxy(fast_settings(fleet.urls)) as (url, _),
    ):
        c = client(url)
        queued = await c.responses.create(
            model=MODEL, input="Write a long essay", max_output_tokens=4000, background=True
        )

        async def generating() -> bool:
            return not idle(fleet)

        await eventually(generating, within=30, what="an engine generating the response")
        cancelled = await c.responses.cancel(queued.id)
        assert cancelled.id == queued.id and cancelled.status == "cancelled"
        assert (await c.responses.retrieve(queued.id)).status == "cancelled"
        await eventually(lambda: idle(fleet), within=30, what="the engine's request aborted")
        # A finished response stays as it was; a response made without background is not
        # cancellable.
        assert (await c.responses.cancel(queued.id)).status == "cancelled"
        plain = await c.responses.create(model=MODEL, input="hi", max_output_tokens=2)
        with pytest.raises(openai.BadRequestError):
            await c.responses.cancel(plain.id)
        await c.close()


async def test_unknown_ids_are_404_in_the_openai_shape(fleet: SimFleet) -> None:
    async with (
        running_proxy(fast_settings(fleet.urls)) as (url, _),
        httpx.AsyncClient(base_url=url) as h,
    ):
        for method, path, body in (
            ("GET", "/v1/responses/resp_nope", None),
            ("DELETE", "/v1/responses/resp_nope", None),
            ("POST", "/v1/responses/resp_nope/cancel", None),
            ("POST", "/v1/responses", {"model": MODEL, "input": "hi",
                                       "previous_response_id": "resp_nope"}),
        ):  # fmt: skip
            r = await h.request(method, path, json=body)
            assert r.status_code == 404, (method, path)
            error = r.json()["error"]
            assert error["message"] == "Response with id 'resp_nope' not found."
            assert error["type"] == "invalid_request_error"
        # store: false keeps nothing to retrieve or continue.
        r = await h.post("/v1/responses", json={"model": MODEL, "input": "hi", "store": False,
                                                "max_output_tokens": 2})  # fmt: skip
        assert r.status_code == 200 and r.json()["store"] is False
        assert (await h.get(f"/v1/responses/{r.json()['id']}")).status_code == 404


async def test_another_keys_response_is_not_found(fleet: SimFleet) -> None:
    settings = fast_settings(fleet.urls, api_keys=["key-alice", "key-bob"])
    async with running_proxy(settings) as (url, _):
        alice, bob = client(url, "key-alice"), client(url, "key-bob")
        mine = await alice.responses.create(model=MODEL, input="secret", max_output_tokens=3)
        assert (await alice.responses.retrieve(mine.id)).id == mine.id
        with pytest.raises(openai.NotFoundError):
            await bob.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            await bob.responses.create(
                model=MODEL, input="tell me", previous_response_id=mine.id, max_output_tokens=3
            )
        with pytest.raises(openai.NotFoundError):
            await bob.responses.delete(mine.id)
        assert (await alice.responses.retrieve(mine.id)).id == mine.id  # still there
        with pytest.raises(openai.AuthenticationError):
            await client(url, "key-eve").responses.retrieve(mine.id)
        for c in (alice, bob):
            await c.close()


async def test_a_stream_cut_midway_ends_with_an_error_event_and_stores_nothing(
    fleet: SimFleet,
) -> None:
    for engine in fleet.engines:
        engine.faults.settings.cut_stream_after_tokens = 3
    async with (
        running_proxy(fast_settings(fleet.urls)) as (url, _),
        httpx.AsyncClient(base_url=url) as h,
    ):
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 20, "stream": True}
        async with h.stream("POST", "/v1/responses", json=body) as r:
            events = [e async for e in r.aiter_text()]
        text = "".join(events)
        assert text.startswith("event: response.created")
        assert "response.completed" not in text
        last = text.rstrip().rsplit("\n\n", 1)[-1]
        assert last.startswith("data: ") and '"error"' in last
        created = text.split("\n", 2)[1].removeprefix("data: ")
        rid = httpx.Response(200, content=created).json()["response"]["id"]
        assert (await h.get(f"/v1/responses/{rid}")).status_code == 404


async def test_with_prefix_aware_routing_a_thread_stays_with_the_engine_holding_it(
    fleet: SimFleet,
) -> None:
    settings = fast_settings(fleet.urls, policy="prefix_aware", backend_header=True)
    async with running_proxy(settings) as (url, _):
        c = client(url)
        # A first turn long enough to fill the prefix index's blocks.
        thread = await thread_of(c, 4, opening="Here is the whole story so far. " * 20)
        assert len({backend for _, backend in thread}) == 1
        assert_whole_history(thread)
        await c.close()


async def test_two_proxy_replicas_on_one_store_file_continue_each_others_threads(
    fleet: SimFleet, tmp_path
) -> None:
    path = tmp_path / "responses.sqlite3"
    settings = fast_settings(fleet.urls, responses_store_path=path)
    async with running_proxy(settings) as (url_a, _), running_proxy(settings) as (url_b, _):
        a, b = client(url_a), client(url_b)
        previous = None
        turns = []
        for i in range(4):
            replica = (a, b)[i % 2]
            made = await replica.responses.create(
                model=MODEL, input=f"Turn {i}", max_output_tokens=4,
                **({"previous_response_id": previous} if previous else {}),
            )  # fmt: skip
            turns.append((made, ""))
            previous = made.id
        assert_whole_history(turns)
        assert (await a.responses.retrieve(previous)).id == previous
        await b.responses.delete(previous)
        with pytest.raises(openai.NotFoundError):
            await a.responses.retrieve(previous)
        for c in (a, b):
            await c.close()


async def test_a_thread_over_two_replicas_and_three_engines_survives_an_engine_restart(
    fleet: SimFleet, tmp_path
) -> None:
    """Five turns, alternating between two proxy replicas that share one store, over three
    engines, one of them crashed after turn 2 and back, empty, before turn 4: every turn
    answers, and every engine that served a turn read the whole thread before it."""
    path = tmp_path / "responses.sqlite3"
    settings = fast_settings(
        fleet.urls, policy="round_robin", backend_header=True, responses_store_path=path
    )
    async with (
        running_proxy(settings) as (url_a, app_a),
        running_proxy(settings) as (url_b, app_b),
    ):
        replicas = (client(url_a), client(url_b))
        thread: list[tuple[Any, str]] = []
        previous: str | None = None
        for i in range(5):
            if i == 2:
                await fleet.engines[0].crash()
            if i == 3:
                await fleet.engines[0].recover()

                def routable() -> bool:
                    return all(
                        len(app.core.fleet.routable(app.core.clock.now())) == 3
                        for app in (app_a, app_b)
                    )

                await eventually(routable, within=30, what="the restarted engine routable")
            raw = await replicas[i % 2].responses.with_raw_response.create(
                model=MODEL,
                input=f"Turn {i}: and then?",
                max_output_tokens=5,
                **({"previous_response_id": previous} if previous else {}),
            )
            made = raw.parse()
            assert made.status in ("completed", "incomplete") and made.output_text, i
            assert made.previous_response_id == previous
            thread.append((made, raw.headers["x-fleet-backend"]))
            previous = made.id
        assert len({backend for _, backend in thread}) >= 2
        assert_whole_history(thread)
        for c in replicas:
            await c.close()


async def test_a_cancel_sent_to_another_replica_stops_the_engines_request(tmp_path) -> None:
    """The background response runs in replica A; its cancel reaches replica B, which shares
    the store: B answers `cancelled`, and A, finding the cancel in the store, aborts the
    engine's request (the engine goes idle long before the 4,000 tokens would end)."""
    path = tmp_path / "responses.sqlite3"
    # No end of sequence: the 4,000 tokens take far longer than the cancel's way round.
    endless = dataclasses.replace(load_profile(DEFAULT_PROFILE), eos_probability=0.0)
    async with await start_fleet(1, speed=0.5, profile=endless) as fleet:
        settings = fast_settings(fleet.urls, responses_store_path=path)
        async with (
            running_proxy(settings) as (url_a, _),
            running_proxy(settings) as (url_b, _),
        ):
            a, b = client(url_a), client(url_b)
            queued = await a.responses.create(
                model=MODEL, input="Write a long essay", max_output_tokens=4000, background=True
            )

            async def generating() -> bool:
                return not idle(fleet)

            await eventually(generating, within=30, what="the engine generating the response")
            cancelled = await b.responses.cancel(queued.id)
            assert cancelled.status == "cancelled"
            await eventually(lambda: idle(fleet), within=30, what="the engine idle")
            # Aborted there, not run to its end.
            async with httpx.AsyncClient() as h:
                metrics = (await h.get(fleet.urls[0] + "/metrics")).text
            aborted = [
                line for line in metrics.splitlines()
                if line.startswith("vllm:request_success_total{") and 'finished_reason="abort"' in line
            ]  # fmt: skip
            assert aborted and float(aborted[0].rsplit(" ", 1)[1]) == 1.0, aborted
            assert (await a.responses.retrieve(queued.id)).status == "cancelled"
            for c in (a, b):
                await c.close()
