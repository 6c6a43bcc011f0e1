"""A client that disconnects mid-stream makes the real engine drop the request."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.real_vllm.tier import Proxy, Tier, engine_metric, wait_until

pytestmark = pytest.mark.real_vllm

MAX_TOKENS = 3000  # far more than can be generated in the second the engine has to drop it


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_disconnect_mid_stream_frees_the_engine(proxy: Proxy, tier: Tier, endpoint: str) -> None:
    body: dict[str, Any]
    if endpoint == "/v1/completions":
        body = {"model": tier.model, "prompt": "Tell me a long story about the river"}
    else:
        body = {"model": tier.model, "messages": [{"role": "user", "content": "A long story?"}]}
    body |= {"max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}

    client = httpx.Client(timeout=120)
    resp = client.send(
        client.build_request("POST", f"{proxy.url}{endpoint}", json=body), stream=True
    )
    assert resp.status_code == 200
    engine = tier.by_backend_id(resp.headers["x-fleet-backend"])
    finished_before = engine_metric(engine.url, "vllm:request_success_total")
    generated_before = engine_metric(engine.url, "vllm:generation_tokens_total")
    # Keep the iterator referenced: a discarded httpx line iterator closes the connection,
    # which would be the disconnect itself, too early.
    lines = resp.iter_lines()
    data_lines = (line for line in lines if line.startswith("data: "))
    for _ in range(5):
        next(data_lines)
    # The engine's gauges follow its steps; on a loaded machine they may trail the chunks.
    assert wait_until(
        lambda: engine_metric(engine.url, "vllm:num_requests_running") == 1, timeout=10.0
    )

    resp.close()  # the client goes away mid-stream
    client.close()
    closed_at = time.monotonic()
    generated_at_close = engine_metric(engine.url, "vllm:generation_tokens_total")
    # The requirement: the engine's running count is back to 0 within a second.
    assert wait_until(
        lambda: engine_metric(engine.url, "vllm:num_requests_running") == 0, timeout=1.0
    ), f"still running {time.monotonic() - closed_at:.2f} s after the client left"
    # Dropped, not finished: no request completed normally (vLLM does not count aborts in
    # request_success_total), fewer tokens were generated than were asked for, and few
    # after the client left. (Before it left the engine generates freely: the buffers
    # between a client that stops reading and the engine hold thousands of events.)
    assert engine_metric(engine.url, "vllm:request_success_total") == finished_before
    generated_total = engine_metric(engine.url, "vllm:generation_tokens_total")
    before_close = generated_at_close - generated_before
    after_close = generated_total - generated_at_close
    assert before_close + after_close < MAX_TOKENS, (before_close, after_close)
    assert after_close < MAX_TOKENS / 4, (before_close, after_close)
