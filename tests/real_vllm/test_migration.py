"""A planned move between the two real engines: the client's greedy stream equals an
uninterrupted run, token for token and character for character."""

from __future__ import annotations

import httpx
import pytest

from tests.real_vllm.moves import TOTAL, Read, body, read_stream
from tests.real_vllm.tier import Proxy, Tier, engine_metric, wait_until

pytestmark = pytest.mark.real_vllm


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
async def test_a_planned_move_continues_token_exactly(
    proxy: Proxy, tier: Tier, endpoint: str
) -> None:
    request = body(tier.model, endpoint)
    async with httpx.AsyncClient(timeout=180) as client:
        reference = await read_stream(client, tier.engines[0].url + endpoint, request)
        assert len(reference.token_ids) == TOTAL and reference.done == 1
        # A model that repeats one token would make the comparison trivially true.
        assert len(set(reference.token_ids)) > TOTAL // 2, reference.token_ids
        moved: list[dict[str, object]] = []

        async def move(r: Read) -> None:
            resp = await client.post(f"{proxy.url}/admin/requests/{r.request_id}/migrate", json={})
            assert resp.status_code == 200, resp.text
            moved.append(resp.json())
            source = tier.by_backend_id(r.backend)
            assert wait_until(
                lambda: engine_metric(source.url, "vllm:num_requests_running") == 0, 10.0
            ), "the source engine still runs the moved request"

        got = await read_stream(client, proxy.url + endpoint, request, after=8, action=move)
    assert got.errors == [] and got.done == 1
    assert got.token_ids == reference.token_ids
    assert got.text == reference.text
    [result] = moved
    assert result["outcome"] == "ok", result
    assert result["source"] == got.backend and result["target"] != got.backend
