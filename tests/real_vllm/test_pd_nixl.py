"""Prefill/decode disaggregation with NixlConnector on real engines, direct (REFERENCE §3):
the prefill engine computes the prompt's KV, the decode engine pulls it over NIXL and
generates; greedy output must equal an ordinary run of the same request."""

from __future__ import annotations

import random
import uuid
from typing import Any

import httpx
import pytest

from tests.real_vllm.tier import Tier, engine_metric, engine_samples

pytestmark = pytest.mark.real_vllm

MAX_TOKENS = 20
FIRST_DECODE_TIMEOUT = 180.0  # the first transfer includes the NIXL handshake (~30 s here)
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def completion(url: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/v1/completions",
        json=body,
        headers={"X-Request-Id": request_id},
        timeout=FIRST_DECODE_TIMEOUT,
    )
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def test_two_step_pd_equals_an_aggregated_run(pd_tier: Tier) -> None:
    prefill = next(e for e in pd_tier.engines if e.role == "prefill")
    decode = next(e for e in pd_tier.engines if e.role == "decode")
    # A fresh prompt of several KV blocks, so nothing of it is cached anywhere yet.
    rng = random.Random(uuid.uuid4().int)
    prompt = [rng.randrange(16, 2000) for _ in range(300)]
    body = {
        "model": pd_tier.model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    request_id = f"pd-{uuid.uuid4().hex}"

    # 1. Prefill leg: one token, and the engine keeps the KV blocks for the decode engine.
    prefill_body = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": REMOTE_DECODE}
    params = completion(prefill.url, prefill_body, request_id)["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_block_ids"], params
    assert params["remote_port"] == prefill.nixl_side_channel_port
    assert params["remote_host"] == "127.0.0.1"
    assert params["remote_engine_id"] and params["remote_request_id"]

    # 2. Decode leg: the original body plus what the prefill leg returned.
    decoded = completion(decode.url, {**body, "kv_transfer_params": params}, request_id)
    tokens = decoded["choices"][0]["token_ids"]

    # 3. The same request, ordinary, on one engine.
    plain = completion(prefill.url, body, f"plain-{uuid.uuid4().hex}")["choices"][0]["token_ids"]
    assert len(tokens) == MAX_TOKENS
    assert len(set(tokens)) > MAX_TOKENS // 2, tokens  # not a degenerate repeated token
    assert tokens == plain

    # The decode engine really pulled KV over NIXL rather than prefilling locally.
    nixl = {name for name, _, _ in engine_samples(decode.url) if name.startswith("vllm:nixl_")}
    assert nixl, "the decode engine publishes no vllm:nixl_* series"
    assert engine_metric(decode.url, "vllm:nixl_xfer_time_seconds_count") >= 1, sorted(nixl)
