"""`GET /v1/responses/{id}/input_items` through the proxy with the `openai` SDK
(`client.responses.input_items.list`): a response's own input items from the proxy's store,
in pages, newest first unless asked otherwise. vLLM 0.32 does not serve this route; OpenAI's
clients call it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from simulator.fleet import SimFleet, start_fleet
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(1, speed=20.0) as f:
        yield f


def said(item: object) -> str:
    content = getattr(item, "content")  # noqa: B009 - the SDK's items are a union of types
    return "".join(part.text for part in content)


async def test_a_responses_input_items_are_listed_in_pages(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        words = ["one", "two", "three", "four", "five"]
        made = await c.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": w} for w in words],
            max_output_tokens=2,
        )
        follow = await c.responses.create(
            model=MODEL, input="six", previous_response_id=made.id, max_output_tokens=2
        )
        # Newest first by default, fetched two at a time by the SDK's paging.
        listed = [item async for item in c.responses.input_items.list(made.id, limit=2)]
        assert [said(i) for i in listed] == words[::-1]
        assert all(i.type == "message" and i.role == "user" and i.id for i in listed)
        assert len({i.id for i in listed}) == 5
        page = await c.responses.input_items.list(made.id, order="asc", limit=3)
        assert [said(i) for i in page.data] == words[:3]
        assert page.has_more is True
        assert page.first_id == page.data[0].id and page.last_id == page.data[2].id
        rest = await c.responses.input_items.list(made.id, order="asc", after=page.last_id)
        assert [said(i) for i in rest.data] == words[3:] and rest.has_more is False
        # A follow-up's items are its own input, not its thread's.
        (own,) = [i async for i in c.responses.input_items.list(follow.id)]
        assert said(own) == "six"
        with pytest.raises(openai.NotFoundError):
            await c.responses.input_items.list("resp_unknown")
        with pytest.raises(openai.BadRequestError):
            await c.responses.input_items.list(made.id, limit=1000)
        await c.close()
    async with running_proxy(fast_settings(fleet.urls)) as (url, _), httpx.AsyncClient() as h:
        r = await h.post(f"{url}/v1/responses/resp_x/input_items")
        assert r.status_code == 405 and r.headers["allow"] == "GET"
