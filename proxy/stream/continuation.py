"""Whether a generation request may be continued on another server, and the body that does it.

A streaming request asks vLLM for `return_token_ids`; the proxy then holds the prompt token ids
(for chat, with the chat template already applied) and every generated token id. To continue on
another server it sends a `/v1/completions` request whose `prompt` is those prompt ids followed
by the k generated ids, with the output limits lowered by k and the same sampling parameters.
Greedy decoding then yields exactly the tokens an uninterrupted run would have produced;
unseeded sampling yields a sample from the same distribution. Chat continues through
`/v1/completions` too: the template was applied by the source server and comes back as ids, so
`add_generation_prompt: false` and `continue_final_message: true` are as movable as any chat.

A request is movable only when every field it sets is known to mean the same thing after the
move. A field set to null counts as absent (only `continuation_body` tells a completions
`max_tokens: null`, "no limit" to vLLM, from an absent one, which means 16). The rules, checked
in this order (the first that applies gives the reason):

| the body sets (for its endpoint)                                    | reason                     |
|---------------------------------------------------------------------|----------------------------|
| an endpoint other than `completions` / `chat/completions`           | `unsupported_endpoint`     |
| `n` other than 1                                                    | `n_gt_1`                   |
| `best_of` other than 1                                              | `best_of`                  |
| `use_beam_search` true                                              | `beam_search`              |
| `echo` true                                                         | `echo`                     |
| `logprobs` (completions: any int; chat: true), `top_logprobs`       | `logprobs`                 |
| `prompt_logprobs`                                                   | `prompt_logprobs`          |
| `suffix`                                                            | `suffix`                   |
| `guided_*`, `structural_tag`, `structured_outputs`,                 | `structured_output`        |
|   `response_format` other than `{"type": "text"}`                   |                            |
| `tools` non-empty, `tool_choice` other than "none", `functions`,    | `tools`                    |
|   `function_call`                                                   |                            |
| `mm_processor_kwargs` non-empty                                     | `multimodal`               |
| `prompt_embeds`                                                     | `prompt_embeds`            |
| `truncate_prompt_tokens`                                            | `truncate_prompt_tokens`   |
| `stop` a non-empty string or list                                   | `stop_strings`             |
| `presence_penalty` non-zero                                         | `presence_penalty`         |
| `frequency_penalty` non-zero                                        | `frequency_penalty`        |
| `bad_words` non-empty                                               | `bad_words`                |
| `logits_processors` non-empty                                       | `logits_processors`        |
| `vllm_xargs` non-empty                                              | `vllm_xargs`               |
| `max_repetition_pattern_size`, `min_repetition_pattern_size` or     | `repetition_detection`     |
|   `repetition_min_count` non-zero                                   |                            |
| `kv_transfer_params`                                                | `kv_transfer`              |
| `reasoning_effort`, `include_reasoning`, `thinking`, `reasoning`,   | `reasoning`                |
|   or `chat_template_kwargs` with a truthy value under a key naming  |                            |
|   "think" or "reason" (`enable_thinking: true`, `thinking: true`)   |                            |
| completions: `prompt` missing, empty or malformed                   | `invalid_prompt`           |
| completions: `prompt` holding more than one prompt (a batch)        | `batch_prompt`             |
| chat: `messages` missing, empty or malformed                        | `invalid_messages`         |
| chat: a message content part whose `type` is not "text"             | `multimodal`               |
| a field outside the endpoint's allowlist                            | `unknown_field:<name>`     |

Each of those is not movable at all. Past them:

| the body sets                  | movable | planned | reason   |
|--------------------------------|---------|---------|----------|
| `seed`                         | yes     | no      | `seed`   |
| nothing above                  | yes     | yes     | ""       |

The allowlist: `model`, `max_tokens`, `min_tokens`, `temperature`, `top_p`, `top_k`, `min_p`,
`repetition_penalty`, `length_penalty`, `seed`, `stop_token_ids`, `ignore_eos`,
`skip_special_tokens`, `spaces_between_special_tokens`, `include_stop_str_in_output`,
`logit_bias`, `allowed_token_ids`, `priority`, `cache_salt`, `user`, `stream`, `stream_options`
(`continuous_usage_stats` included), `return_token_ids`, `return_tokens_as_token_ids`,
`add_special_tokens`, `request_id`, `metadata`, `store`, `service_tier`; for chat also
`messages`, `max_completion_tokens`, `add_generation_prompt`, `continue_final_message`,
`chat_template`, `chat_template_kwargs`, `documents`, `parallel_tool_calls`; for completions
also `prompt`; and every field of the table above at a value that does not block.

Why each blocked field blocks:
- several choices, beam search, echo, suffix, prompt embeddings, batch prompts: the
  continuation is one sequence after one token-id prompt; none of these has a counterpart.
- logprobs: the continuation would have to reproduce per-token logprobs in the client's format;
  prompt logprobs would cover the generated tokens too.
- structured output, tools: the grammar state and the tool parser's state live on the source
  server and are not rebuilt from a token prompt.
- stop strings: the proxy cannot know the text a vLLM detokenizer holds back while a stop
  string may be forming, so the text already sent and the target's text could disagree.
- presence / frequency penalties and bad words: vLLM applies them to output tokens only; after
  the move the first k output tokens are prompt tokens and would stop counting (a bad word of
  several tokens is matched against the output's tail). Repetition detection likewise watches
  the output only. `repetition_penalty` applies to prompt and output tokens alike, so it
  survives the move.
- truncate_prompt_tokens: the target would truncate the longer prompt again, differently.
- kv_transfer_params: the request is one leg of a prefill/decode pair.
- logits processors, vllm_xargs: custom code whose state over the output is unknown.
- reasoning: a reasoning parser splits the chat output into two fields, which a completions
  continuation does not do.
- seed: the target cannot resume the source's random sequence, so a seeded request is moved
  only when the alternative is an error (failover), never by a planned move.

What the body cannot show, and the caller must know of the fleet: source and target serve the
same model with the same generation config (omitted sampling fields take the server's defaults,
which vLLM applies alike to chat and completions); a chat server runs no reasoning parser and is
no harmony (gpt-oss) model, whose chat path adds stop tokens and channels of its own. Without a
client limit the continuation asks for the room left in the context; a server-side default cap
(the generation config's `max_new_tokens`) is not visible here and is not lowered by k.

vLLM's chat and completion requests share their decoding defaults (`skip_special_tokens` and
`spaces_between_special_tokens` true in both); they differ in `add_special_tokens` (chat false,
completions true), which applies only when text is tokenized, never to a token-id prompt, and
in the output limit, which `continuation_body` resolves as the source server did.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COMPLETIONS = "completions"
CHAT = "chat/completions"

# vLLM's CompletionRequest: `max_tokens` defaults to 16 when the field is absent.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class Movability:
    movable: bool  # may be continued elsewhere at all
    planned: bool  # may be moved by a planned move (rebalance, drain); False: failover only
    reason: str  # "" when movable and planned; else a short stable snake_case reason


_PLANNED = Movability(True, True, "")
_SEEDED = Movability(True, False, "seed")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _not_one(_endpoint: str, v: Any) -> bool:
    return not (_int(v) and v == 1)


def _not_false(_endpoint: str, v: Any) -> bool:
    return v is not False


def _set(_endpoint: str, _v: Any) -> bool:
    return True


def _non_empty(_endpoint: str, v: Any) -> bool:
    # Only a provably empty value is harmless; anything else blocks.
    return not (isinstance(v, str | list | dict) and len(v) == 0)


def _non_zero(_endpoint: str, v: Any) -> bool:
    return not (_number(v) and v == 0)


def _logprobs(endpoint: str, v: Any) -> bool:
    # Completions take an int (0 already returns the sampled token's logprob); chat a bool.
    return True if endpoint == COMPLETIONS else v is not False


def _response_format(_endpoint: str, v: Any) -> bool:
    return not (isinstance(v, Mapping) and v.get("type") == "text")


def _tool_choice(_endpoint: str, v: Any) -> bool:
    return not (isinstance(v, str) and v == "none")


def _thinking_kwargs(_endpoint: str, v: Any) -> bool:
    if not isinstance(v, Mapping):
        return True
    return any(
        bool(value) and ("think" in str(key).lower() or "reason" in str(key).lower())
        for key, value in v.items()
    )


# (field, blocks(endpoint, value), reason), checked in order on non-null fields.
_BLOCKERS: tuple[tuple[str, Callable[[str, Any], bool], str], ...] = (
    ("n", _not_one, "n_gt_1"),
    ("best_of", _not_one, "best_of"),
    ("use_beam_search", _not_false, "beam_search"),
    ("echo", _not_false, "echo"),
    ("logprobs", _logprobs, "logprobs"),
    ("top_logprobs", _set, "logprobs"),
    ("prompt_logprobs", _set, "prompt_logprobs"),
    ("suffix", _set, "suffix"),
    ("guided_json", _set, "structured_output"),
    ("guided_regex", _set, "structured_output"),
    ("guided_choice", _set, "structured_output"),
    ("guided_grammar", _set, "structured_output"),
    ("guided_decoding_backend", _set, "structured_output"),
    ("guided_whitespace_pattern", _set, "structured_output"),
    ("structural_tag", _set, "structured_output"),
    ("structured_outputs", _set, "structured_output"),
    ("response_format", _response_format, "structured_output"),
    ("tools", _non_empty, "tools"),
    ("tool_choice", _tool_choice, "tools"),
    ("functions", _set, "tools"),
    ("function_call", _set, "tools"),
    ("mm_processor_kwargs", _non_empty, "multimodal"),
    ("prompt_embeds", _set, "prompt_embeds"),
    ("truncate_prompt_tokens", _set, "truncate_prompt_tokens"),
    ("stop", _non_empty, "stop_strings"),
    ("presence_penalty", _non_zero, "presence_penalty"),
    ("frequency_penalty", _non_zero, "frequency_penalty"),
    ("bad_words", _non_empty, "bad_words"),
    ("logits_processors", _non_empty, "logits_processors"),
    ("vllm_xargs", _non_empty, "vllm_xargs"),
    ("max_repetition_pattern_size", _non_zero, "repetition_detection"),
    ("min_repetition_pattern_size", _non_zero, "repetition_detection"),
    ("repetition_min_count", _non_zero, "repetition_detection"),
    ("kv_transfer_params", _set, "kv_transfer"),
    ("reasoning_effort", _set, "reasoning"),
    ("include_reasoning", _set, "reasoning"),
    ("thinking", _set, "reasoning"),
    ("reasoning", _set, "reasoning"),
    ("chat_template_kwargs", _thinking_kwargs, "reasoning"),
)

# Sampling and stop fields that mean the same on the target; carried as they are.
_CARRIED: tuple[str, ...] = (
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "length_penalty",
    "seed",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "logit_bias",
    "allowed_token_ids",
    "priority",
    "cache_salt",
    "user",
)

# Known to be safe to leave behind: they shaped the prompt ids (which the target receives
# as they are), are the proxy's own to set, or have no effect on generation in vLLM.
_SAFE_COMMON = frozenset(
    {
        *_CARRIED,
        "max_tokens",
        "min_tokens",
        "stream",
        "stream_options",
        "return_token_ids",
        "return_tokens_as_token_ids",  # formats logprobs only, which a movable request lacks
        "add_special_tokens",
        "request_id",
        "metadata",
        "store",
        "service_tier",
    }
)
_SAFE_CHAT = _SAFE_COMMON | {
    "messages",
    "max_completion_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "documents",
    "parallel_tool_calls",  # no effect without tools
}
_SAFE_COMPLETIONS = _SAFE_COMMON | {"prompt"}
_KNOWN = {
    COMPLETIONS: _SAFE_COMPLETIONS | {name for name, _, _ in _BLOCKERS},
    CHAT: _SAFE_CHAT | {name for name, _, _ in _BLOCKERS},
}


def _prompt_problem(prompt: Any) -> str:
    """Why a completions prompt blocks the move; empty for one prompt (text or token ids, bare
    or as a batch of one)."""
    if isinstance(prompt, str):
        return ""
    if not isinstance(prompt, list) or not prompt:
        return "invalid_prompt"
    if all(_int(t) for t in prompt):
        return ""
    if all(isinstance(p, str) for p in prompt) or all(
        isinstance(p, list) and p and all(_int(t) for t in p) for p in prompt
    ):
        return "" if len(prompt) == 1 else "batch_prompt"
    return "invalid_prompt"


def _messages_problem(messages: Any) -> str:
    """Why chat messages block the move; empty when every message is text only."""
    if not isinstance(messages, list) or not messages:
        return "invalid_messages"
    for m in messages:
        if not isinstance(m, Mapping):
            return "invalid_messages"
        content = m.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            return "invalid_messages"
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                return "multimodal"
    return ""


def movability(endpoint: str, body: Mapping[str, Any]) -> Movability:
    """Whether `body` (the client's parsed JSON for `endpoint`, "completions" or
    "chat/completions") may be continued on another server, following the module's table:
    the first rule that applies gives the reason; a seeded request is movable for failover only.
    """
    if endpoint not in _KNOWN:
        return Movability(False, False, "unsupported_endpoint")
    for name, blocks, reason in _BLOCKERS:
        value = body.get(name)
        if value is not None and blocks(endpoint, value):
            return Movability(False, False, reason)
    problem = (
        _prompt_problem(body.get("prompt"))
        if endpoint == COMPLETIONS
        else _messages_problem(body.get("messages"))
    )
    if problem:
        return Movability(False, False, problem)
    known = _KNOWN[endpoint]
    for name, value in body.items():
        if value is not None and name not in known:
            return Movability(False, False, f"unknown_field:{name}")
    if body.get("seed") is not None:
        return _SEEDED
    return _PLANNED


def _int_field(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _int(value):
        raise ValueError(f"{name} is not an integer: {value!r}")
    return int(value)


def _client_limit(endpoint: str, body: Mapping[str, Any]) -> int | None:
    """The output limit the source server applied; None: as many tokens as the context holds."""
    if endpoint == CHAT:
        limit = _int_field(body, "max_completion_tokens")
        return limit if limit is not None else _int_field(body, "max_tokens")
    if "max_tokens" not in body:
        return COMPLETIONS_DEFAULT_MAX_TOKENS
    # An explicit null is not the same as absent: vLLM's field defaults to 16 but a null
    # reaches its limit logic as "no limit".
    return _int_field(body, "max_tokens")


def tokens_left(
    endpoint: str,
    body: Mapping[str, Any],
    prompt_len: int,
    generated: int,
    *,
    max_model_len: int | None,
) -> int | None:
    """The tokens the source server would still generate after `generated` of them: the
    client's limit less those, or without a limit the room left in `max_model_len` (None when
    that is unknown). 0 or less: the request reached its limit. ValueError when a limit is not
    an integer."""
    limit = _client_limit(endpoint, body)
    if limit is not None:
        return limit - generated
    if max_model_len is None:
        return None
    # What vLLM does without a limit: whatever room the context has left.
    return max_model_len - prompt_len - generated


def continuation_body(
    endpoint: str,
    body: Mapping[str, Any],
    prompt_ids: Sequence[int],
    generated: Sequence[int],
    *,
    max_model_len: int | None,
) -> dict[str, Any]:
    """The /v1/completions body that continues `body` after `generated` (k = len(generated)).

    `prompt` is the prompt ids followed by the generated ids; `max_tokens` is the client's limit
    less k (chat: `max_completion_tokens`, else `max_tokens`; completions: `max_tokens`, 16 when
    absent), or, when the client set none, the room left in `max_model_len`; `min_tokens` is
    lowered by k and dropped at 0. The sampling and stop fields are carried; the backend is
    always asked to stream with usage and token ids. `body` is not modified.

    Raises ValueError when `body` is not movable, the prompt is empty, a limit is not an
    integer, no limit is set and `max_model_len` is unknown, or fewer than one token would
    remain.
    """
    verdict = movability(endpoint, body)
    if not verdict.movable:
        raise ValueError(f"request is not movable: {verdict.reason}")
    if not prompt_ids:
        raise ValueError("no prompt token ids to continue from")
    prompt = [*prompt_ids, *generated]
    k = len(generated)

    remaining = tokens_left(endpoint, body, len(prompt_ids), k, max_model_len=max_model_len)
    if remaining is None:
        raise ValueError("no output limit and max_model_len unknown")
    if remaining < 1:
        raise ValueError(f"no tokens left to generate ({remaining})")

    out: dict[str, Any] = {"prompt": prompt, "max_tokens": remaining}
    for name in _CARRIED:
        value = body.get(name)
        if value is not None:
            # Deep copies: the caller may change the new body without touching the client's.
            out[name] = copy.deepcopy(value)
    # min_tokens counts output tokens; the first k of them are now prompt.
    min_tokens = _int_field(body, "min_tokens")
    if min_tokens is not None and min_tokens - k > 0:
        out["min_tokens"] = min_tokens - k
    out["return_token_ids"] = True
    out["stream"] = True
    out["stream_options"] = {"include_usage": True}
    return out
