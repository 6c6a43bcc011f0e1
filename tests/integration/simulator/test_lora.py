"""A simulated engine serving LoRA adapters on a real port: /v1/models, requests naming an
adapter, and vllm:lora_requests_info on /metrics."""

from __future__ import annotations

import aiohttp

from fleet.vllm_metrics import parse_engine_metrics
from simulator.fleet import start_fleet
from simulator.lora import LoraConfig
from simulator.tokenizer import Tokenizer
from tests.integration.simulator.conftest import post_json


async def test_adapters_are_listed_served_and_reported(
    tokenizer: Tokenizer, http: aiohttp.ClientSession
) -> None:
    lora = LoraConfig({"sql-lora": "/adapters/sql"}, max_loras=2)
    async with await start_fleet(1, tokenizer=tokenizer, speed=10.0, lora=lora) as fleet:
        url = fleet.urls[0]
        async with http.get(url + "/v1/models") as r:
            cards = (await r.json())["data"]
        base = cards[0]["id"]
        assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
            (base, base, None),
            ("sql-lora", "/adapters/sql", base),
        ]
        status, body = await post_json(
            http,
            url + "/v1/completions",
            {"model": "sql-lora", "prompt": "select the rows", "max_tokens": 3},
        )
        assert status == 200 and body["model"] == "sql-lora"
        status, _ = await post_json(
            http, url + "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1}
        )
        assert status == 404
        async with http.get(url + "/metrics") as r:
            m = parse_engine_metrics(await r.text())
        # The engine's last step ran the adapter's request; max_lora is the configured 2.
        assert (m.lora_running, m.lora_waiting, m.max_lora) == (("sql-lora",), (), 2)


async def test_adapters_load_and_unload_at_run_time_as_vllm_answers(
    tokenizer: Tokenizer, http: aiohttp.ClientSession
) -> None:
    lora = LoraConfig(max_loras=2, runtime_updates=True)
    async with await start_fleet(1, tokenizer=tokenizer, speed=10.0, lora=lora) as fleet:
        url = fleet.urls[0]
        body = {"lora_name": "chat", "lora_path": "/adapters/chat"}
        async with http.post(url + "/v1/load_lora_adapter", json=body) as r:
            assert r.status == 200
            assert await r.text() == "Success: LoRA adapter 'chat' added successfully."
        async with http.post(url + "/v1/load_lora_adapter", json=body) as r:
            assert r.status == 400 and "already been loaded" in (await r.json())["error"]["message"]
        async with http.get(url + "/v1/models") as r:
            assert [c["id"] for c in (await r.json())["data"]][1:] == ["chat"]
        status, answer = await post_json(
            http, url + "/v1/completions", {"model": "chat", "prompt": "hi", "max_tokens": 2}
        )
        assert status == 200 and answer["model"] == "chat"
        async with http.post(url + "/v1/unload_lora_adapter", json={"lora_name": "chat"}) as r:
            assert r.status == 200
            assert await r.text() == "Success: LoRA adapter 'chat' removed successfully."
        async with http.post(url + "/v1/unload_lora_adapter", json={"lora_name": "chat"}) as r:
            assert r.status == 404
        # A restarted engine has only its start-up adapters.
        async with http.post(url + "/v1/load_lora_adapter", json=body) as r:
            assert r.status == 200
        await fleet.engines[0].crash()
        await fleet.engines[0].recover()
        assert not fleet.engines[0].engine.adapters.paths


async def test_without_runtime_updates_the_routes_are_not_served(
    tokenizer: Tokenizer, http: aiohttp.ClientSession
) -> None:
    async with await start_fleet(1, tokenizer=tokenizer, lora=LoraConfig()) as fleet:
        body = {"lora_name": "chat", "lora_path": "/adapters/chat"}
        async with http.post(fleet.urls[0] + "/v1/load_lora_adapter", json=body) as r:
            assert r.status == 404
