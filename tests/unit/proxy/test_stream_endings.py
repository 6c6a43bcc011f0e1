"""The events the proxy writes for a stream that lost its ending are the events vLLM (and the
splicer, which writes a moved stream as vLLM would) writes, byte for byte; and the rule that
says a stream reached its limit."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.stream.continuation import tokens_left
from proxy.stream.splice import (
    CHAT,
    COMPLETIONS,
    Splicer,
    StreamIdentity,
    finish_event,
    usage_event,
)

IDENTITY = StreamIdentity("cmpl-1", 7, "m")


def splicer(endpoint: str, *, token_ids: bool) -> Splicer:
    return Splicer(
        endpoint=endpoint, identity=IDENTITY, prompt_tokens=3, tokens_before=4,
        include_usage=True, continuous_usage=False, token_ids=token_ids,
    )  # fmt: skip


def backend_event(choices: list[Any], **extra: Any) -> bytes:
    event = {"id": "cmpl-b", "object": "text_completion", "created": 9, "model": "m",
             "choices": choices, **extra}  # fmt: skip
    return b"data: " + orjson.dumps(event) + b"\n\n"


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("token_ids", [False, True], ids=["no_ids", "ids"])
def test_a_finishing_event_is_the_one_a_final_event_without_text_becomes(
    endpoint: str, token_ids: bool
) -> None:
    final = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
             "stop_reason": None, "prompt_token_ids": None, "token_ids": []}  # fmt: skip
    spliced = splicer(endpoint, token_ids=token_ids).rewrite(backend_event([final]))
    assert finish_event(endpoint, IDENTITY, "length", token_ids=token_ids) == spliced
    choice = orjson.loads(spliced[6:])["choices"][0]
    assert choice["finish_reason"] == "length"
    assert ("token_ids" in choice) is token_ids


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_a_usage_event_is_the_one_the_splicer_writes(endpoint: str) -> None:
    usage = {"prompt_tokens": 7, "total_tokens": 9, "completion_tokens": 2}
    spliced = splicer(endpoint, token_ids=False).rewrite(backend_event([], usage=usage))
    # The splicer counts the client's request: 3 prompt tokens, 4 before the move + 2.
    assert usage_event(endpoint, IDENTITY, 3, 6) == spliced


@pytest.mark.parametrize(
    ("endpoint", "body", "prompt", "generated", "max_model_len", "left"),
    [
        (COMPLETIONS, {"max_tokens": 5}, 3, 5, None, 0),
        (COMPLETIONS, {"max_tokens": 5}, 3, 4, None, 1),
        (COMPLETIONS, {}, 3, 16, None, 0),  # vLLM's default of 16
        (COMPLETIONS, {"max_tokens": None}, 3, 5, 8, 0),  # null: the context's room
        (CHAT, {"max_completion_tokens": 4, "max_tokens": 100}, 3, 4, None, 0),
        (CHAT, {"max_tokens": 6}, 3, 4, None, 2),
        (CHAT, {}, 3, 4, 10, 3),
        (CHAT, {}, 3, 4, None, None),  # no limit and the context unknown
    ],
)
def test_the_tokens_a_request_has_left(
    endpoint: str,
    body: dict[str, Any],
    prompt: int,
    generated: int,
    max_model_len: int | None,
    left: int | None,
) -> None:
    assert tokens_left(endpoint, body, prompt, generated, max_model_len=max_model_len) == left


def test_a_limit_that_is_not_an_integer_is_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        tokens_left(COMPLETIONS, {"max_tokens": "5"}, 3, 5, max_model_len=None)
