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
