"""The simulator's Responses API, reached directly with the `openai` SDK: vLLM 0.32's shapes
for a text model, whole and streamed, and no stored responses of its own."""

from __future__ import annotations

import openai
import pytest

from simulator.fleet import SimFleet
from simulator.tokenizer import Tokenizer

MODEL = "sim-llama-8b"


async def test_a_response_reads_its_input_as_chat_over_the_template(
    fleet: SimFleet, tokenizer: Tokenizer
) -> None:
    c = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="x", max_retries=0)
    made = await c.responses.create(
        model=MODEL, instructions="Be brief.", input="Hello there", max_output_tokens=5
    )
    assert made.id.startswith("resp_") and made.object == "response" and made.model == MODEL
    assert made.status == "incomplete" and made.incomplete_details is not None
    assert made.incomplete_details.reason == "max_output_tokens"
    [item] = made.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text" and made.output_text
    prompt = tokenizer.apply_chat_template([("system", "Be brief."), ("user", "Hello there")])
    assert made.usage is not None
    assert (made.usage.input_tokens, made.usage.output_tokens) == (len(prompt), 5)
    # An earlier answer given back as input (as the proxy expands a thread) is read as text.
    again = await c.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Hello there"},
            item.model_dump(),
            {"role": "user", "content": [{"type": "input_text", "text": "More"}]},
        ],
        max_output_tokens=3,
    )
    assert again.usage is not None and again.usage.input_tokens > made.usage.total_tokens
    await c.close()


async def test_a_streamed_response_is_named_events_ending_with_the_whole_response(
    fleet: SimFleet,
) -> None:
    c = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="x", max_retries=0)
    stream = await c.responses.create(model=MODEL, input="hi", max_output_tokens=4, stream=True)
    events = [e async for e in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == deltas and final.usage.output_tokens == 4
    await c.close()


async def test_an_engine_keeps_no_thread(fleet: SimFleet) -> None:
    c = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        await c.responses.create(model=MODEL, input="hi", previous_response_id="resp_elsewhere")
    await c.close()
