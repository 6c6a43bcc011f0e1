"""Prefill/decode disaggregation with NixlConnector's two-step protocol: a 1-token prefill
request whose answer carries kv_transfer_params, then the decode request that passes them on."""

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fleet.types import Role
from proxy.backends.kv_transfer import remote_decode_params
from simulator.fleet import SimFleet, start_fleet
from simulator.tokenizer import Tokenizer
from tests.integration.simulator.conftest import post_json
from tests.support.polling import eventually

MODEL = "sim-llama-8b"
PREFILL_KV = remote_decode_params()
BODY = {
    "model": MODEL,
    "prompt": "A long shared document. " * 30,
    "max_tokens": 12,
    "ignore_eos": True,
    "return_token_ids": True,
}


def _metric(page: str, name: str) -> float:
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


async def _pd_fleet(tokenizer: Tokenizer) -> SimFleet:
    return await start_fleet(
        3, tokenizer=tokenizer, speed=4.0, role=[Role.PREFILL, Role.DECODE, Role.BOTH]
    )


async def test_two_step_transfer_gives_the_plain_output(
    tokenizer: Tokenizer, http: aiohttp.ClientSession
):
    async with await _pd_fleet(tokenizer) as fleet:
        prefill, decode, plain = fleet.engines
        headers = {"X-Request-Id": "pd-1"}
        status, first = await post_json(
            http,
            prefill.url + "/v1/completions",
            {**BODY, "max_tokens": 1, "kv_transfer_params": PREFILL_KV},
            headers=headers,
        )
        assert status == 200
        kv = first["kv_transfer_params"]
        assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
        assert kv["remote_block_ids"] and kv["tp_size"] == 1
        assert (kv["remote_host"], kv["remote_port"]) == (prefill.host, prefill.port)
        assert kv["remote_request_id"] == "cmpl-pd-1" and kv["remote_engine_id"]
        assert prefill.engine.core.held and prefill.engine.core.pool.usage() > 0

        status, second = await post_json(
            http,
            decode.url + "/v1/completions",
            {**BODY, "kv_transfer_params": kv},
            headers=headers,
        )
        assert status == 200
        _, reference = await post_json(http, plain.url + "/v1/completions", BODY)
        assert second["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]

        # The prefill engine let go of the blocks once read.
        assert not prefill.engine.core.held and prefill.engine.core.pool.usage() == 0.0
        async with http.get(decode.url + "/metrics") as r:
            page = await r.text()
        assert _metric(page, "vllm:nixl_xfer_time_seconds_count") == 1
        assert _metric(page, "vllm:nixl_xfer_time_seconds_sum") > 0
        # Only the last prompt token was computed locally: 1 + 11 decode tokens in all.
        assert _metric(page, "vllm:iteration_tokens_total_sum") == 12


async def test_unread_blocks_are_freed_after_the_timeout(
    tokenizer: Tokenizer, http: aiohttp.ClientSession
):
    async with await _pd_fleet(tokenizer) as fleet:
        prefill = fleet.engines[0]
        prefill.engine.core.hold_timeout_s = 0.2
        status, first = await post_json(
            http,
            prefill.url + "/v1/completions",
            {**BODY, "max_tokens": 1, "kv_transfer_params": PREFILL_KV},
        )
        assert status == 200 and first["kv_transfer_params"]["remote_block_ids"]
        await eventually(lambda: not prefill.engine.core.held)
        assert prefill.engine.core.pool.usage() == 0.0


async def test_failed_pull_falls_back_to_local_prefill(
    tokenizer: Tokenizer, http: aiohttp.ClientSession
):
    async with await _pd_fleet(tokenizer) as fleet:
        prefill, decode, plain = fleet.engines
        _, first = await post_json(
            http,
            prefill.url + "/v1/completions",
            {**BODY, "max_tokens": 1, "kv_transfer_params": PREFILL_KV},
        )
        kv = first["kv_transfer_params"]
        await prefill.crash()  # the blocks are gone with it
        status, second = await post_json(
            http, decode.url + "/v1/completions", {**BODY, "kv_transfer_params": kv}
        )
        assert status == 200
        _, reference = await post_json(http, plain.url + "/v1/completions", BODY)
        assert second["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
        async with http.get(decode.url + "/metrics") as r:
            page = await r.text()
        assert _metric(page, "vllm:nixl_xfer_time_seconds_count") == 0
        assert fleet.by_role(Role.DECODE) == [decode]
