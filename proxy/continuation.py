"""Which requests can move, and the request that continues one on another backend. Pure.

A generation continues token-exactly on another vLLM server when that server gets, as a
`/v1/completions` request, the prompt's token ids followed by the k ids generated so far
(for chat too: the ids vLLM returned already have the chat template applied), with the
output limits lowered by k and the same sampling parameters. Greedy decoding then yields
exactly what one server would have produced; sampling continues from exactly those tokens.

What cannot move (`movability`), and why:

| reason | fields |
|---|---|
| n_gt_1 | `n` other than 1 |
| best_of | `best_of` over 1 |
| beam_search | `use_beam_search` |
| echo | `echo` (the prompt would be echoed again) |
| suffix | `suffix` |
| logprobs | `logprobs`, `top_logprobs` (their shapes differ by endpoint) |
| prompt_logprobs | `prompt_logprobs` |
| stop_strings | `stop`: vLLM holds back text that may begin a stop string, unseen here |
| penalties | non-zero `presence_penalty`, `frequency_penalty` (see below) |
| guided_decoding | `guided_*`, `structured_outputs`, a non-text `response_format` |
| tools | `tools`, `functions`, a `tool_choice` other than none: a tool-call parser |
| reasoning | `reasoning_effort`, `include_reasoning`, a thinking switch in `chat_template_kwargs` |
| multimodal | a chat content part that is not text |
| prompt_embeds | `prompt_embeds` |
| truncate_prompt_tokens | `truncate_prompt_tokens` (the target would truncate a different prompt) |
| batch_prompt | a completions `prompt` holding several prompts |
| kv_transfer_params | a request that is itself a leg of prefill/decode disaggregation |
| unknown_field:NAME | any field not known to be safe to carry |

Presence and frequency penalties count only output tokens, and the k generated tokens become
prompt tokens on the target; `repetition_penalty` counts prompt and output alike, so it
survives a move.

A request with a `seed` can move, but on failure only (reason `seed`, `planned` False): another
server cannot reproduce the same random sequence, so a planned move would change an answer
that the client could otherwise have reproduced; after a failure it beats an error.
Null-valued fields count as absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COMPLETIONS = "completions"
CHAT = "chat/completions"

# vLLM's CompletionRequest default when `max_tokens` is absent.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

# Fields carried to the continuation unchanged.
_CARRIED = (
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
    "bad_words",
    "user",
    "priority",
    "cache_salt",
    "presence_penalty",
    "frequency_penalty",
)
# Fields known to be safe that the continuation rebuilds or leaves out.
_REBUILT = (
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "stream",
    "stream_options",
    "return_token_ids",
    "add_special_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "documents",
    "metadata",
    "store",
    "service_tier",
    "request_id",
    "n",
    "best_of",
    "use_beam_search",
    "echo",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tool_choice",
    "parallel_tool_calls",
    "tools",
    "stop",
    "chat_template_kwargs",
)
_KNOWN = frozenset(_CARRIED) | frozenset(_REBUILT)
_GUIDED = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    "structured_outputs",
)
# Blocking fields whose mere presence (non-null) says what they are.
_PRESENT_BLOCKS = {
    "suffix": "suffix",
    "prompt_logprobs": "prompt_logprobs",
    "prompt_embeds": "prompt_embeds",
    "truncate_prompt_tokens": "truncate_prompt_tokens",
    "kv_transfer_params": "kv_transfer_params",
    "functions": "tools",
    "reasoning_effort": "reasoning",
    "include_reasoning": "reasoning",
    **dict.fromkeys(_GUIDED, "guided_decoding"),
}
_THINKING_KEYS = ("enable_thinking", "thinking", "reasoning")


@dataclass(frozen=True, slots=True)
class Movability:
    movable: bool  # may be continued on another backend at all
    planned: bool  # may be moved on purpose (rebalance, drain), not only after a failure
    reason: str  # "" when movable and planned; else a short stable reason


MOVABLE = Movability(movable=True, planned=True, reason="")


def movability(endpoint: str, body: Mapping[str, Any]) -> Movability:
    """Whether a request to `endpoint` ("completions" | "chat/completions") can move."""
    reason = _blocking_reason(endpoint, body)
    if reason:
        return Movability(movable=False, planned=False, reason=reason)
    if body.get("seed") is not None:
        return Movability(movable=True, planned=False, reason="seed")
    return MOVABLE


def _blocking_reason(endpoint: str, body: Mapping[str, Any]) -> str:
    for key, value in body.items():
        if value is None:
            continue
        if key in _PRESENT_BLOCKS:
            return _PRESENT_BLOCKS[key]
        if key not in _KNOWN:
            return f"unknown_field:{key}"
    n = body.get("n")
    if n is not None and n != 1:
        return "n_gt_1"
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        return "best_of"
    if body.get("use_beam_search"):
        return "beam_search"
    if body.get("echo"):
        return "echo"
    logprobs = body.get("logprobs")
    if (logprobs is not None and logprobs is not False) or body.get("top_logprobs") is not None:
        return "logprobs"
    stop = body.get("stop")
    if stop:  # "" and [] stop nothing
        return "stop_strings"
    if body.get("presence_penalty") or body.get("frequency_penalty"):
        return "penalties"
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") in (None, "text")):
        return "guided_decoding"
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools or (choice is not None and choice != "none"):
        return "tools"
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, Mapping) and any(kwargs.get(k) for k in _THINKING_KEYS):
        return "reasoning"
    if endpoint == CHAT and _has_non_text_part(body.get("messages")):
        return "multimodal"
    if endpoint == COMPLETIONS and _is_batch(body.get("prompt")):
        return "batch_prompt"
    return ""


def _has_non_text_part(messages: Any) -> bool:
    if not isinstance(messages, list):
        return False
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list):
            for part in content:
                if not (isinstance(part, Mapping) and part.get("type") == "text"):
                    return True
    return False


def _is_batch(prompt: Any) -> bool:
    """Several prompts: a list of strings or of token-id lists with more than one item."""
    return isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str | list)


def continuation_body(
    endpoint: str,
    body: Mapping[str, Any],
    prompt_ids: Sequence[int],
    generated: Sequence[int],
    *,
    max_model_len: int | None,
) -> dict[str, Any]:
    """The `/v1/completions` body that continues `body` after its `generated` tokens.

    Raises ValueError when no token is left to generate, or when a chat request without an
    output limit must be continued on a backend whose context length is unknown."""
    k = len(generated)
    prompt = [*prompt_ids, *generated]
    limit = _client_limit(endpoint, body)
    if limit is None:
        # vLLM's chat default: whatever room the context leaves.
        if max_model_len is None:
            raise ValueError("no output limit and the backend's max_model_len is unknown")
        remaining = max_model_len - len(prompt)
    else:
        remaining = limit - k
    if remaining < 1:
        raise ValueError(f"no token left to generate after {k} (limit {limit})")
    out: dict[str, Any] = {}
    for key in _CARRIED:
        value = body.get(key)
        if value is not None:
            out[key] = value
    out["prompt"] = prompt
    out["max_tokens"] = remaining
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int) and min_tokens - k > 0:
        out["min_tokens"] = min_tokens - k
    out["return_token_ids"] = True
    out["stream"] = True
    out["stream_options"] = {"include_usage": True}
    return out


def _client_limit(endpoint: str, body: Mapping[str, Any]) -> int | None:
    if endpoint == CHAT:
        for key in ("max_completion_tokens", "max_tokens"):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None
    value = body.get("max_tokens")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return COMPLETIONS_DEFAULT_MAX_TOKENS
