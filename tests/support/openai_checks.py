"""Checks through the real `openai` SDK that several suites make against different fronts
(the proxy itself, Envoy asking the endpoint picker)."""

from __future__ import annotations

import openai
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion


async def chat_streams_as_it_answers(
    client: openai.AsyncOpenAI, model: str
) -> tuple[ChatCompletion, CompletionUsage]:
    """A 6-token chat answered whole, then streamed with usage: the same text (the simulated
    engines are deterministic, so it holds whichever engine takes each), 6 tokens each. The
    whole answer and the stream's usage."""
    chat = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=6
    )
    assert chat.usage is not None and chat.usage.completion_tokens == 6
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == 6
    assert "".join(text) == chat.choices[0].message.content
    return chat, usage
