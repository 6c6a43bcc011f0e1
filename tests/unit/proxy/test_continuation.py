"""Movability of a request and the /v1/completions body that continues it elsewhere."""

import copy
from typing import Any

import pytest

from proxy.stream.continuation import Movability, continuation_body, movability

CHAT = "chat/completions"
COMPLETIONS = "completions"

PLANNED = Movability(movable=True, planned=True, reason="")


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "Hello", **fields}


def body_for(endpoint: str, **fields: Any) -> dict[str, Any]:
    return chat(**fields) if endpoint == CHAT else completion(**fields)


# --- movability --------------------------------------------------------------------------------


def test_plain_requests_are_movable_and_planned() -> None:
    assert movability(CHAT, chat()) == PLANNED
    assert movability(COMPLETIONS, completion()) == PLANNED


# Fields that block the move on both endpoints, with the reason each gives.
BLOCKED_BOTH = [
    ({"n": 2}, "n_gt_1"),
    ({"n": 0}, "n_gt_1"),
    ({"best_of": 2}, "best_of"),
    ({"use_beam_search": True}, "beam_search"),
    ({"echo": True}, "echo"),
    ({"top_logprobs": 2}, "logprobs"),
    ({"prompt_logprobs": 0}, "prompt_logprobs"),
    ({"suffix": "tail"}, "suffix"),
    ({"guided_json": {"type": "object"}}, "structured_output"),
    ({"guided_regex": "a+"}, "structured_output"),
    ({"guided_choice": ["a", "b"]}, "structured_output"),
    ({"guided_grammar": "root ::= 'a'"}, "structured_output"),
    ({"guided_decoding_backend": "xgrammar"}, "structured_output"),
    ({"guided_whitespace_pattern": " "}, "structured_output"),
    ({"structural_tag": "{}"}, "structured_output"),
    ({"structured_outputs": {"regex": "a+"}}, "structured_output"),
    ({"response_format": {"type": "json_object"}}, "structured_output"),
    ({"response_format": {"type": "json_schema", "json_schema": {}}}, "structured_output"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "auto"}, "tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools"),
    ({"functions": [{"name": "f"}]}, "tools"),
    ({"function_call": "auto"}, "tools"),
    ({"mm_processor_kwargs": {"fps": 1}}, "multimodal"),
    ({"prompt_embeds": "AAAA"}, "prompt_embeds"),
    ({"truncate_prompt_tokens": 100}, "truncate_prompt_tokens"),
    ({"stop": "\n"}, "stop_strings"),
    ({"stop": ["END", "STOP"]}, "stop_strings"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -0.1}, "frequency_penalty"),
    ({"bad_words": ["darn"]}, "bad_words"),
    ({"logits_processors": ["mod.Proc"]}, "logits_processors"),
    ({"vllm_xargs": {"k": 1}}, "vllm_xargs"),
    ({"max_repetition_pattern_size": 8}, "repetition_detection"),
    ({"min_repetition_pattern_size": 2}, "repetition_detection"),
    ({"repetition_min_count": 3}, "repetition_detection"),
    ({"kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer"),
    ({"reasoning_effort": "low"}, "reasoning"),
    ({"include_reasoning": False}, "reasoning"),
    ({"thinking": {"type": "enabled"}}, "reasoning"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"frobnicate": 1}, "unknown_field:frobnicate"),
]


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(("fields", "reason"), BLOCKED_BOTH)
def test_blocking_fields(endpoint: str, fields: dict[str, Any], reason: str) -> None:
    assert movability(endpoint, body_for(endpoint, **fields)) == Movability(False, False, reason)


@pytest.mark.parametrize(
    ("endpoint", "fields", "reason"),
    [
        (COMPLETIONS, {"logprobs": 0}, "logprobs"),
        (COMPLETIONS, {"logprobs": 5}, "logprobs"),
        (CHAT, {"logprobs": True}, "logprobs"),
        (CHAT, {"chat_template_kwargs": {"enable_thinking": True}}, "reasoning"),
        (CHAT, {"chat_template_kwargs": {"thinking": True}}, "reasoning"),
        (CHAT, {"chat_template_kwargs": {"reasoning_effort": "high"}}, "reasoning"),
        (CHAT, {"chat_template_kwargs": "not a mapping"}, "reasoning"),
        # Fields of the other endpoint are unknown here: vLLM would ignore them.
        (CHAT, {"prompt": "x"}, "unknown_field:prompt"),
        (COMPLETIONS, {"messages": []}, "unknown_field:messages"),
        (COMPLETIONS, {"max_completion_tokens": 5}, "unknown_field:max_completion_tokens"),
        (COMPLETIONS, {"add_generation_prompt": False}, "unknown_field:add_generation_prompt"),
    ],
)
def test_endpoint_specific_blocking(endpoint: str, fields: dict[str, Any], reason: str) -> None:
    assert movability(endpoint, body_for(endpoint, **fields)) == Movability(False, False, reason)


@pytest.mark.parametrize(
    ("prompt", "reason"),
    [
        (["a", "b"], "batch_prompt"),
        ([[1, 2], [3]], "batch_prompt"),
        ([], "invalid_prompt"),
        ([[]], "invalid_prompt"),
        ([1, "a"], "invalid_prompt"),
        (7, "invalid_prompt"),
        (None, "invalid_prompt"),
    ],
)
def test_completion_prompt_shapes_that_block(prompt: Any, reason: str) -> None:
    assert movability(COMPLETIONS, completion(prompt=prompt)) == Movability(False, False, reason)


@pytest.mark.parametrize("prompt", ["text", ["one text"], [1, 2, 3], [[1, 2, 3]]])
def test_single_prompts_are_movable(prompt: Any) -> None:
    assert movability(COMPLETIONS, completion(prompt=prompt)) == PLANNED


def test_prompt_embeds_without_a_prompt_names_the_embeddings() -> None:
    body = {"model": "m", "prompt_embeds": "AAAA"}
    assert movability(COMPLETIONS, body).reason == "prompt_embeds"


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([], "invalid_messages"),
        (None, "invalid_messages"),
        ("hi", "invalid_messages"),
        (["hi"], "invalid_messages"),
        ([{"role": "user", "content": {"text": "hi"}}], "invalid_messages"),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "http://x/i.png"}},
                    ],
                }
            ],
            "multimodal",
        ),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "multimodal"),
        ([{"role": "user", "content": [{"text": "no type"}]}], "multimodal"),
    ],
)
def test_chat_messages_that_block(messages: Any, reason: str) -> None:
    assert movability(CHAT, chat(messages=messages)) == Movability(False, False, reason)


def test_text_only_chat_with_history_is_movable() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "user", "content": "again"},
    ]
    assert movability(CHAT, chat(messages=messages)) == PLANNED


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_seed_is_movable_for_failover_only(endpoint: str) -> None:
    assert movability(endpoint, body_for(endpoint, seed=7)) == Movability(True, False, "seed")
    assert movability(endpoint, body_for(endpoint, seed=None)) == PLANNED


def test_a_blocking_field_outranks_the_seed() -> None:
    assert movability(CHAT, chat(seed=7, n=2)) == Movability(False, False, "n_gt_1")


# Values that do not change generation after a move: the request stays planned-movable.
HARMLESS_BOTH: list[dict[str, Any]] = [
    {"n": 1},
    {"best_of": 1},
    {"use_beam_search": False},
    {"echo": False},
    {"stop": ""},
    {"stop": []},
    {"presence_penalty": 0},
    {"frequency_penalty": 0.0},
    {"bad_words": []},
    {"tools": []},
    {"tool_choice": "none"},
    {"response_format": {"type": "text"}},
    {"mm_processor_kwargs": {}},
    {"max_repetition_pattern_size": 0},
    # Null counts as absent, for blocking fields and unknown ones alike.
    {"logprobs": None, "stop": None, "seed": None, "suffix": None, "frobnicate": None},
    {
        "max_tokens": 100,
        "min_tokens": 3,
        "temperature": 0.0,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
        "length_penalty": 1.0,
        "stop_token_ids": [2],
        "ignore_eos": False,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": True,
        "include_stop_str_in_output": True,
        "logit_bias": {"13": -100},
        "allowed_token_ids": [1, 2, 3],
        "user": "u",
        "metadata": {"k": "v"},
        "store": False,
        "service_tier": "auto",
        "priority": 1,
        "request_id": "r-1",
        "cache_salt": "salt",
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "add_special_tokens": True,
    },
]


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("fields", HARMLESS_BOTH)
def test_harmless_values_stay_movable(endpoint: str, fields: dict[str, Any]) -> None:
    assert movability(endpoint, body_for(endpoint, **fields)) == PLANNED


@pytest.mark.parametrize(
    "fields",
    [
        {"logprobs": False},
        # The source server applies the template and returns the ids: these shape only them.
        {"add_generation_prompt": False, "continue_final_message": True},
        {"chat_template": "{{ messages }}", "documents": [{"title": "t", "text": "x"}]},
        {"chat_template_kwargs": {"enable_thinking": False, "custom": "x"}},
        {"max_completion_tokens": 50},
        {"parallel_tool_calls": True},
    ],
)
def test_harmless_chat_values_stay_movable(fields: dict[str, Any]) -> None:
    assert movability(CHAT, chat(**fields)) == PLANNED


@pytest.mark.parametrize("endpoint", ["embeddings", "responses", ""])
def test_other_endpoints_are_not_movable(endpoint: str) -> None:
    assert movability(endpoint, chat()) == Movability(False, False, "unsupported_endpoint")


# --- continuation_body -------------------------------------------------------------------------

PROMPT_IDS = [1, 10, 11, 12]
GENERATED = [20, 21, 22]  # k = 3


def test_completion_continuation() -> None:
    body = completion(max_tokens=10, temperature=0.0, stream=False)
    out = continuation_body(COMPLETIONS, body, PROMPT_IDS, GENERATED, max_model_len=None)
    assert out == {
        "model": "m",
        "prompt": [1, 10, 11, 12, 20, 21, 22],
        "max_tokens": 7,
        "temperature": 0.0,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_chat_continuation_goes_out_as_a_token_prompt() -> None:
    body = chat(max_completion_tokens=10, temperature=0.0)
    out = continuation_body(CHAT, body, PROMPT_IDS, GENERATED, max_model_len=None)
    assert out == {
        "model": "m",
        "prompt": [1, 10, 11, 12, 20, 21, 22],
        "max_tokens": 7,
        "temperature": 0.0,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@pytest.mark.parametrize(
    ("endpoint", "fields", "max_model_len", "expected"),
    [
        (COMPLETIONS, {"max_tokens": 10}, None, 7),
        # vLLM's completions default when the field is absent.
        (COMPLETIONS, {}, None, 16 - 3),
        (COMPLETIONS, {}, 100, 16 - 3),
        # An explicit null reaches vLLM as "no limit": the room left in the context.
        (COMPLETIONS, {"max_tokens": None}, 100, 100 - 7),
        (CHAT, {"max_tokens": 10}, None, 7),
        (CHAT, {"max_completion_tokens": 10}, None, 7),
        # max_completion_tokens wins over the deprecated max_tokens.
        (CHAT, {"max_completion_tokens": 10, "max_tokens": 50}, None, 7),
        (CHAT, {"max_completion_tokens": None, "max_tokens": 50}, None, 47),
        # Chat without a limit: what room the context has left after prompt + generated.
        (CHAT, {}, 100, 100 - 7),
        (CHAT, {}, 8, 1),
        # The client's limit holds even where the context would allow more.
        (CHAT, {"max_tokens": 10}, 100, 7),
        (COMPLETIONS, {"max_tokens": 4}, None, 1),
    ],
)
def test_max_tokens_lowered_by_k(
    endpoint: str, fields: dict[str, Any], max_model_len: int | None, expected: int
) -> None:
    body = body_for(endpoint, **fields)
    out = continuation_body(endpoint, body, PROMPT_IDS, GENERATED, max_model_len=max_model_len)
    assert out["max_tokens"] == expected


def test_nothing_generated_yet_keeps_the_limit() -> None:
    out = continuation_body(COMPLETIONS, completion(max_tokens=5), [1, 2], [], max_model_len=None)
    assert out["prompt"] == [1, 2]
    assert out["max_tokens"] == 5


@pytest.mark.parametrize(
    ("min_tokens", "expected"),
    [(10, 7), (4, 1), (3, None), (2, None), (0, None), (None, None)],
)
def test_min_tokens_lowered_and_dropped_at_zero(
    min_tokens: int | None, expected: int | None
) -> None:
    body = completion(max_tokens=20, min_tokens=min_tokens)
    out = continuation_body(COMPLETIONS, body, PROMPT_IDS, GENERATED, max_model_len=None)
    assert out.get("min_tokens") == expected
    assert ("min_tokens" in out) == (expected is not None)


CARRIED = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "length_penalty": 1.0,
    "seed": 1234,
    "stop_token_ids": [2, 3],
    "ignore_eos": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "include_stop_str_in_output": True,
    "logit_bias": {"13": -100.0},
    "allowed_token_ids": [20, 21, 22, 23],
    "priority": 5,
    "cache_salt": "s4lt",
    "user": "alice",
}


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_sampling_and_stop_fields_are_carried(endpoint: str) -> None:
    body = body_for(endpoint, max_tokens=20, **CARRIED)
    out = continuation_body(endpoint, body, PROMPT_IDS, GENERATED, max_model_len=None)
    for name, value in CARRIED.items():
        assert out[name] == value, name
    assert out["model"] == "m"


DROPPED_CHAT = {
    "max_completion_tokens": 20,
    "add_generation_prompt": False,
    "continue_final_message": True,
    "chat_template": "{{ messages }}",
    "chat_template_kwargs": {"custom": 1},
    "documents": [{"title": "t", "text": "x"}],
    "add_special_tokens": True,
    "echo": False,
    "n": 1,
    "request_id": "r-1",
    "logprobs": False,
    "parallel_tool_calls": False,
    "metadata": {"k": "v"},
    "store": False,
    "service_tier": "auto",
    "return_tokens_as_token_ids": True,
    "stop": [],
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "tool_choice": "none",
    "response_format": {"type": "text"},
}


def test_chat_only_and_request_scoped_fields_are_dropped() -> None:
    body = chat(**DROPPED_CHAT)
    out = continuation_body(CHAT, body, PROMPT_IDS, GENERATED, max_model_len=None)
    assert "messages" not in out
    for name in DROPPED_CHAT:
        assert name not in out, name
    assert out["max_tokens"] == 17


def test_completion_only_fields_are_dropped() -> None:
    body = completion(suffix=None, echo=False, n=1, best_of=1, add_special_tokens=False)
    out = continuation_body(COMPLETIONS, body, PROMPT_IDS, GENERATED, max_model_len=None)
    for name in ("suffix", "echo", "n", "best_of", "add_special_tokens"):
        assert name not in out, name
    assert out["prompt"] == [*PROMPT_IDS, *GENERATED]


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_streaming_and_token_ids_are_forced(endpoint: str) -> None:
    body = body_for(
        endpoint,
        max_tokens=20,
        stream=False,
        stream_options={"include_usage": False, "continuous_usage_stats": True},
        return_token_ids=False,
    )
    out = continuation_body(endpoint, body, PROMPT_IDS, GENERATED, max_model_len=None)
    assert out["stream"] is True
    assert out["stream_options"] == {"include_usage": True}
    assert out["return_token_ids"] is True


def test_the_client_body_is_left_alone() -> None:
    body = chat(max_tokens=20, min_tokens=5, stop_token_ids=[2], logit_bias={"1": 1.0})
    before = copy.deepcopy(body)
    prompt_ids, generated = list(PROMPT_IDS), list(GENERATED)
    out = continuation_body(CHAT, body, prompt_ids, generated, max_model_len=None)
    # Changing the new body touches neither the client's body nor the id lists.
    out["stop_token_ids"].append(99)
    out["logit_bias"]["2"] = 2.0
    out["prompt"].append(99)
    assert body == before
    assert prompt_ids == PROMPT_IDS and generated == GENERATED


def test_the_seeded_request_can_still_be_continued() -> None:
    out = continuation_body(
        COMPLETIONS, completion(seed=3), PROMPT_IDS, GENERATED, max_model_len=None
    )
    assert out["seed"] == 3


@pytest.mark.parametrize(
    ("endpoint", "fields", "max_model_len", "match"),
    [
        # No limit and no context size to derive one from.
        (CHAT, {}, None, "max_model_len"),
        (COMPLETIONS, {"max_tokens": None}, None, "max_model_len"),
        # Nothing left to generate.
        (COMPLETIONS, {"max_tokens": 3}, None, "no tokens left"),
        (COMPLETIONS, {"max_tokens": 2}, None, "no tokens left"),
        (CHAT, {"max_completion_tokens": 3}, None, "no tokens left"),
        (CHAT, {}, 7, "no tokens left"),
        # Not movable at all.
        (CHAT, {"n": 2}, 100, "not movable: n_gt_1"),
        (COMPLETIONS, {"stop": "x"}, 100, "not movable: stop_strings"),
        # A limit that is not an integer.
        (COMPLETIONS, {"max_tokens": "10"}, 100, "not an integer"),
        (CHAT, {"max_completion_tokens": 10.5}, 100, "not an integer"),
        (CHAT, {"max_tokens": 20, "min_tokens": "2"}, 100, "not an integer"),
    ],
)
def test_value_errors(
    endpoint: str, fields: dict[str, Any], max_model_len: int | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        continuation_body(
            endpoint,
            body_for(endpoint, **fields),
            PROMPT_IDS,
            GENERATED,
            max_model_len=max_model_len,
        )


def test_empty_prompt_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="prompt"):
        continuation_body(COMPLETIONS, completion(), [], [5], max_model_len=100)
