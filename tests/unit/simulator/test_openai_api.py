"""Request parsing and response shapes, as vLLM 0.32 has them."""

import orjson
import pytest

from simulator.openai_api import CHAT, COMPLETIONS, ApiError, ChunkWriter, parse_request
from simulator.tokenizer import BOS_ID, Tokenizer


def _parse(kind: str, body: dict[str, object], tokenizer: Tokenizer, max_len: int = 64):
    return parse_request(kind, body, tokenizer, "m", max_len)


def test_completion_prompt_text_gets_bos_and_token_ids_pass_through(tokenizer: Tokenizer) -> None:
    p = _parse(COMPLETIONS, {"model": "m", "prompt": "hello"}, tokenizer)
    assert p.prompt_ids[0] == BOS_ID and p.params.max_tokens == 16
    q = _parse(COMPLETIONS, {"model": "m", "prompt": [5, 6, 7], "max_tokens": 3}, tokenizer)
    assert q.prompt_ids == [5, 6, 7] and q.params.max_tokens == 3


def test_chat_default_max_tokens_fills_the_context(tokenizer: Tokenizer) -> None:
    p = _parse(CHAT, {"messages": [{"role": "user", "content": "hi"}]}, tokenizer)
    assert p.params.max_tokens == 64 - len(p.prompt_ids)
    q = _parse(
        CHAT,
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 5,
            "max_tokens": 9,
        },
        tokenizer,
    )
    assert q.prompt_ids == p.prompt_ids and q.params.max_tokens == 5


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "other", "prompt": "x"}, 404, "does not exist"),
        ({"prompt": "word " * 80}, 400, "maximum context length is 64 tokens"),
        ({"prompt": "x", "max_tokens": 100}, 400, "'max_tokens' or 'max_completion_tokens' is too"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream=True"),
        ({"prompt": [1, 10**9]}, 400, "out of vocabulary"),
        ({"prompt": "x", "n": 2}, 400, "n=1"),
        ({"prompt": "x", "stream": True, "stream_options": True}, 400, "must be an object"),
    ],
)
def test_invalid_requests_are_rejected_like_vllm(
    tokenizer: Tokenizer, body: dict[str, object], status: int, needle: str
) -> None:
    with pytest.raises(ApiError) as info:
        _parse(COMPLETIONS, body, tokenizer)
    assert info.value.status == status and needle in info.value.message
    err = info.value.body()["error"]
    assert err["code"] == status and needle in err["message"]


def test_chat_stream_chunks_open_with_role_and_close_with_usage(tokenizer: Tokenizer) -> None:
    p = _parse(
        CHAT,
        {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        },
        tokenizer,
    )
    w = ChunkWriter(p, "chatcmpl-1", p.prompt_ids)
    opening = w.opening()
    assert opening is not None
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert opening["prompt_token_ids"] == p.prompt_ids
    tok = w.tokens([500], " ab", None, None)
    assert tok["choices"][0]["delta"] == {"content": " ab"}
    assert tok["choices"][0]["token_ids"] == [500] and "prompt_token_ids" not in tok
    last = w.tokens([501], " cd", "length", None)
    assert last["choices"][0]["finish_reason"] == "length"
    final = w.final_usage()
    assert final is not None and final["choices"] == []
    assert final["usage"]["completion_tokens"] == 2
    assert final["usage"]["prompt_tokens"] == len(p.prompt_ids)


@pytest.mark.parametrize("kind", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("token_ids", [False, True])
def test_fast_chunk_bytes_equal_the_serialised_chunks(
    tokenizer: Tokenizer, kind: str, token_ids: bool
) -> None:
    body: dict[str, object] = {
        "stream": True,
        "return_token_ids": token_ids,
        "stream_options": {"include_usage": True},
    }
    body.update(
        {"messages": [{"role": "user", "content": "hi"}]} if kind == CHAT else {"prompt": "hi"}
    )
    p = _parse(kind, body, tokenizer)
    fast, slow = ChunkWriter(p, "id-1", p.prompt_ids), ChunkWriter(p, "id-1", p.prompt_ids)
    fast.created = slow.created
    fast.opening()
    slow.opening()
    events = [
        ([5], ' a "quoted"\n', None, None),
        ([6, 7], " b\u00e9", None, None),
        ([], "", None, None),
        ([8], " c", "stop", 8),
    ]
    for ids, text, finish, stop in events:
        want = b"data: " + orjson.dumps(slow.tokens(ids, text, finish, stop)) + b"\n\n"
        assert fast.token_bytes(ids, text, finish, stop) == want
    assert fast.completion_tokens == slow.completion_tokens == 4
