"""The OpenAI-compatible request and response shapes, as vLLM 0.32 reads and writes them.

Pure functions: a request body in, a `ParsedRequest` (or an `ApiError`) out; engine results
in, JSON-ready dicts out. The HTTP layer (server.py) only moves bytes.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson

from simulator.request import GenerationParams, SimRequest
from simulator.tokenizer import VOCAB_SIZE, Tokenizer

VLLM_VERSION = "0.32.0"

COMPLETIONS = "completions"
CHAT = "chat"


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.param)


_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "Error"),
            "param": param,
            "code": status,
        }
    }


@dataclass(slots=True)
class ParsedRequest:
    kind: str  # COMPLETIONS or CHAT
    model: str
    prompt_ids: list[int]
    params: GenerationParams
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    kv_transfer_params: dict[str, Any] | None
    lora: str | None = None  # the LoRA adapter `model` names, if it names one


def unknown_model(model: Any, served_model: str) -> ApiError:
    """vLLM's 404 for a request naming a model the engine does not serve."""
    return ApiError(
        f"The model `{model}` does not exist. Valid aliases: {served_model}.",
        status=404,
        param="model",
    )


def _get_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"{key} must be an integer", param=key)
    return value


def _message_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise ApiError("only text content parts are supported")
        return "".join(parts)
    raise ApiError("message content must be a string or a list of parts")


def chat_prompt_ids(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list", param="messages")
    pairs: list[tuple[str, str]] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError("each message needs a role", param="messages")
        pairs.append((m["role"], _message_text(m.get("content"))))
    cont = bool(body.get("continue_final_message", False))
    add_gen = bool(body.get("add_generation_prompt", True))
    if cont and add_gen:
        raise ApiError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    return tokenizer.apply_chat_template(pairs, add_gen, cont)


def completion_prompt_ids(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_bos=body.get("add_special_tokens", True) is not False)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        bad = [t for t in prompt if not 0 <= t < VOCAB_SIZE]
        if bad:
            raise ApiError(f"Token id {bad[0]} is out of vocabulary", param="prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError("the simulator serves one prompt per request", param="prompt")
    raise ApiError("prompt must be a string or a list of token ids", param="prompt")


def parse_request(
    kind: str,
    body: Any,
    tokenizer: Tokenizer,
    served_model: str,
    max_model_len: int,
    adapters: Collection[str] = (),
) -> ParsedRequest:
    """`adapters`: the LoRA adapters served on top of `served_model`; `model` may name one."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = body.get("model", served_model)
    lora = model if isinstance(model, str) and model in adapters else None
    if model != served_model and lora is None:
        raise unknown_model(model, served_model)
    prompt_ids = (
        chat_prompt_ids(body, tokenizer) if kind == CHAT else completion_prompt_ids(body, tokenizer)
    )
    n_prompt = len(prompt_ids)
    if n_prompt >= max_model_len:  # no room for even one output token
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains at least {n_prompt} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={n_prompt})",
            param="input_tokens",
        )
    n = _get_int(body, "n")
    if n is not None and n != 1:
        raise ApiError("the simulator supports n=1 only", param="n")
    max_tokens = _get_int(body, "max_completion_tokens") if kind == CHAT else None
    if max_tokens is None:
        max_tokens = _get_int(body, "max_tokens")
    room = max_model_len - n_prompt
    if max_tokens is None:
        max_tokens = 16 if kind == COMPLETIONS else room
    if max_tokens < 1:
        raise ApiError("max_tokens must be at least 1", param="max_tokens")
    if max_tokens > room:
        raise ApiError(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has "
            f"{n_prompt} input tokens ({max_tokens} > {max_model_len} - {n_prompt}).",
            param="max_tokens",
        )
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError("stop must be a string or a list of non-empty strings", param="stop")
    stop_ids = body.get("stop_token_ids") or ()
    if not isinstance(stop_ids, list | tuple) or not all(isinstance(t, int) for t in stop_ids):
        raise ApiError("stop_token_ids must be a list of integers", param="stop_token_ids")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError("stream_options must be an object", param="stream_options")
    stream = bool(body.get("stream", False))
    if stream_options and not stream:
        raise ApiError(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise ApiError("kv_transfer_params must be an object", param="kv_transfer_params")
    params = GenerationParams(
        max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
        include_stop_str_in_output=bool(body.get("include_stop_str_in_output", False)),
        min_tokens=_get_int(body, "min_tokens") or 0,
    )
    return ParsedRequest(
        kind=kind,
        model=lora or served_model,
        prompt_ids=prompt_ids,
        params=params,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage", False)),
        continuous_usage=bool(stream_options.get("continuous_usage_stats", False)),
        return_token_ids=bool(body.get("return_token_ids", False)),
        kv_transfer_params=kv,
        lora=lora,
    )


# ---- responses ------------------------------------------------------------------------------
def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def response_id(kind: str, base: str) -> str:
    return f"{'chatcmpl' if kind == CHAT else 'cmpl'}-{base}"


def usage(prompt_tokens: int, completion_tokens: int, details: bool = True) -> dict[str, Any]:
    """Final usage; streamed usage chunks leave out the two detail fields."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if details:
        out["prompt_tokens_details"] = None
        out["completion_tokens_details"] = None
    return out


def system_fingerprint() -> str:
    return f"vllm-{VLLM_VERSION}-simulated"


def full_response(
    p: ParsedRequest,
    rid: str,
    created: int,
    req: SimRequest,
    kv_out: dict[str, Any] | None,
) -> dict[str, Any]:
    out_ids = req.output_ids if p.return_token_ids else None
    prompt_ids = req.prompt_ids if p.return_token_ids else None
    use = usage(len(req.prompt_ids), len(req.output_ids))
    if p.kind == CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": req.output_text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            },
            "logprobs": None,
            "finish_reason": req.finish_reason,
            "stop_reason": req.stop_reason,
            "token_ids": out_ids,
            "routed_experts": None,
        }
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": p.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": system_fingerprint(),
            "usage": use,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids,
            "prompt_text": None,
            "kv_transfer_params": kv_out,
            "ec_transfer_params": None,
            "metrics": None,
        }
    choice = {
        "index": 0,
        "text": req.output_text,
        "logprobs": None,
        "finish_reason": req.finish_reason,
        "stop_reason": req.stop_reason,
        "token_ids": out_ids,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids,
        "routed_experts": None,
    }
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": p.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": system_fingerprint(),
        "usage": use,
        "kv_transfer_params": kv_out,
        "ec_transfer_params": None,
        "metrics": None,
    }


class ChunkWriter:
    """Builds the SSE chunks of one streamed response, key for key as vLLM 0.32 writes them."""

    def __init__(self, p: ParsedRequest, rid: str, prompt_ids: list[int]) -> None:
        self.p = p
        self.rid = rid
        self.created = int(time.time())
        self.prompt_ids = prompt_ids
        self.completion_tokens = 0
        self._first = True
        self._obj = "chat.completion.chunk" if p.kind == CHAT else "text_completion"
        self._mid: tuple[bytes, bytes] | None = None

    def _middle_template(self) -> tuple[bytes, bytes]:
        """The middle chunks of a stream differ only in their text and token ids, so they are
        assembled from bytes made once: this is the per-token hot path of every stream."""
        head = orjson.dumps(self._envelope([]))[: -len(b"[]}")]
        if self.p.kind == CHAT:
            return (
                b"data: " + head + b'[{"index":0,"delta":{"content":',
                b'},"logprobs":null,"finish_reason":null',
            )
        return (
            b"data: " + head + b'[{"index":0,"text":',
            b',"logprobs":null,"finish_reason":null,"stop_reason":null'
            + (b',"prompt_token_ids":null' if self.p.return_token_ids else b""),
        )

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": self._obj,
            "created": self.created,
            "model": self.p.model,
            "choices": choices,
        }

    def _with_usage(self, chunk: dict[str, Any]) -> dict[str, Any]:
        if self.p.include_usage and self.p.continuous_usage:
            chunk["usage"] = usage(len(self.prompt_ids), self.completion_tokens, details=False)
        return chunk

    def opening(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant role before any token."""
        if self.p.kind != CHAT:
            return None
        self._first = False
        chunk = self._envelope(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )
        if self.p.return_token_ids:
            chunk["prompt_token_ids"] = self.prompt_ids
            chunk["prompt_text"] = None
        return self._with_usage(chunk)

    def tokens(
        self,
        token_ids: list[int],
        text: str,
        finish_reason: str | None,
        stop_reason: int | str | None,
    ) -> dict[str, Any]:
        self.completion_tokens += len(token_ids)
        choice: dict[str, Any]
        if self.p.kind == CHAT:
            delta = {"content": text} if (text or not finish_reason) else {}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            if finish_reason is not None:
                choice["stop_reason"] = stop_reason
            if self.p.return_token_ids:
                choice["token_ids"] = token_ids
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
            if self.p.return_token_ids:
                choice["prompt_token_ids"] = self.prompt_ids if self._first else None
                choice["token_ids"] = token_ids
        self._first = False
        return self._with_usage(self._envelope([choice]))

    def token_bytes(
        self,
        token_ids: list[int],
        text: str,
        finish_reason: str | None,
        stop_reason: int | str | None,
    ) -> bytes:
        """The SSE event for new tokens: `tokens()` serialised, by a faster path when the
        chunk is a plain middle one."""
        if (
            finish_reason is not None
            or self.p.continuous_usage
            or (self._first and (self.p.kind != CHAT or self.p.return_token_ids))
            or (not text and self.p.kind == CHAT)
        ):
            return sse(self.tokens(token_ids, text, finish_reason, stop_reason))
        self.completion_tokens += len(token_ids)
        self._first = False
        if self._mid is None:
            self._mid = self._middle_template()
        ids = b',"token_ids":' + orjson.dumps(token_ids) if self.p.return_token_ids else b""
        return b"".join((self._mid[0], orjson.dumps(text), self._mid[1], ids, b"}]}\n\n"))

    def head(self) -> bytes:
        """What a stream opens with, before its first token."""
        opening = self.opening()
        return b"" if opening is None else sse(opening)

    def tail(self) -> bytes:
        """What a finished stream ends with: its usage when asked for, and [DONE]."""
        final = self.final_usage()
        return (b"" if final is None else sse(final)) + b"data: [DONE]\n\n"

    def final_usage(self) -> dict[str, Any] | None:
        if not self.p.include_usage:
            return None
        chunk = self._envelope([])
        chunk["usage"] = usage(len(self.prompt_ids), self.completion_tokens, details=False)
        chunk["system_fingerprint"] = system_fingerprint()
        return chunk
