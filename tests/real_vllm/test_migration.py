"""A planned move between the two real engines: the client's greedy stream equals an
uninterrupted run, token for token and character for character."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.real_vllm.moves import Read, body, read_stream
from tests.real_vllm.tier import Proxy, Tier, engine_metric
from tests.support.polling import eventually, holds_within_blocking

pytestmark = pytest.mark.real_vllm

TOKENS = 600  # long enough to be moved mid-stream (the model is tiny and fast)
# The 2-core machine's engines sometimes hold their output back for seconds and then send it
# in one burst: a request can end before the move reaches it. Such a try is made again, as is
# one whose target failed to take it.
TRIES = 3


async def move_when_running(
    client: httpx.AsyncClient, proxy: Proxy, stream: asyncio.Task[Read]
) -> dict[str, object]:
    """Move the live request as soon as the proxy has relayed a few of its tokens; {} when
    the stream ended first."""

    async def relaying() -> tuple[str | None] | None:
        """(its id,) once it has relayed a few tokens, (None,) if it ended first."""
        if stream.done():
            return (None,)
        rows = (await client.get(proxy.url + "/admin/requests")).json()
        if rows and (rows[0]["tokens_generated"] or 0) >= 8:
            return (str(rows[0]["request_id"]),)
        return None

    (rid,) = await eventually(relaying, within=300, what="a few tokens relayed", every=0.01)
    if rid is None:
        return {}
    resp = await client.post(f"{proxy.url}/admin/requests/{rid}/migrate", json={})
    result: dict[str, object] = resp.json()
    return result


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
async def test_a_planned_move_continues_token_exactly(
    proxy: Proxy, tier: Tier, endpoint: str
) -> None:
    request = body(tier.model, endpoint, TOKENS)
    async with httpx.AsyncClient(timeout=180) as client:
        reference = await read_stream(client, tier.engines[0].url + endpoint, request)
        assert len(reference.token_ids) == TOKENS and reference.done == 1
        # A model that repeats one token would make the comparison trivially true.
        assert len(set(reference.token_ids)) > 20, reference.token_ids
        tries: list[dict[str, object]] = []
        for _ in range(TRIES):
            stream = asyncio.create_task(read_stream(client, proxy.url + endpoint, request))
            moved = await asyncio.wait_for(move_when_running(client, proxy, stream), timeout=120)
            got: Read = await stream
            # Whatever became of the move, the client's answer is whole and exact.
            assert got.errors == [] and got.done == 1 and got.token_ids == reference.token_ids
            if moved.get("outcome") == "ok":
                break
            # `returned`: the other engine failed to take it (a loaded machine's engine can
            # time out), and the request went on where it was; try again.
            assert moved.get("outcome") in ("finished", "not_movable", "returned", None), moved
            tries.append(moved)
        else:
            pytest.fail(f"in {TRIES} tries no request was moved: {tries}")
    assert got.errors == [] and got.done == 1
    assert got.token_ids == reference.token_ids
    assert got.text == reference.text
    assert moved["source"] == got.backend and moved["target"] != got.backend
    source = tier.by_backend_id(got.backend)
    assert holds_within_blocking(
        lambda: engine_metric(source.url, "vllm:num_requests_running") == 0, 10.0
    )
