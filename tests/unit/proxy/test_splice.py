"""Splicing a moved request's completions continuation into the client's stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.stream.splice import CHAT, COMPLETIONS, EventBuffer, Splicer, StreamIdentity
from simulator.openai_api import CHAT as SIM_CHAT
from simulator.openai_api import COMPLETIONS as SIM_COMPLETIONS
from simulator.openai_api import ChunkWriter, ParsedRequest, sse
from simulator.request import GenerationParams
from tests.support.captures import GOLDEN, golden_events, parsed


def continuation_from(
    token_events: list[dict[str, Any]],
    usage_event: dict[str, Any],
    prompt: list[int],
    before: list[int],
) -> bytes:
    """What server B streams for the continuation of a request cut after `before` (ids) was
    generated: a completions stream with return_token_ids and include_usage, its own id and
    created, the prompt + `before` as its prompt, its own usage counts. Built from the client
    stream's token events (completions or chat), so the text and ids are the ones vLLM wrote."""
    rid, created = "cmpl-continuation0000", usage_event["created"] + 7
    out = []
    for n, ev in enumerate(token_events):
        c = ev["choices"][0]
        text = c["delta"].get("content", "") if "delta" in c else c["text"]
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": c["finish_reason"],
            "stop_reason": c.get("stop_reason"),
            "prompt_token_ids": prompt + before if n == 0 else None,
            "token_ids": c["token_ids"],
        }
        out.append(
            sse(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": ev["model"],
                    "choices": [choice],
                }
            )
        )
    use = usage_event["usage"]
    k = len(before)
    out.append(
        sse(
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": usage_event["model"],
                "choices": [],
                "usage": {
                    "prompt_tokens": use["prompt_tokens"] + k,
                    "total_tokens": use["total_tokens"],
                    "completion_tokens": use["completion_tokens"] - k,
                },
                "system_fingerprint": usage_event["system_fingerprint"],
            }
        )
    )
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


# ---- against the real vLLM 0.32 captures ------------------------------------------------------
COMPLETION_PROMPT = [604, 529, 504, 90, 337, 568, 335]


@pytest.mark.parametrize("k", [1, 5, 11])
def test_completions_continuation_reads_as_the_captured_vllm_stream(k: int) -> None:
    events = golden_events("completion_stream.txt")  # 12 token events, usage, [DONE]
    tokens = [parsed(e) for e in events[:12]]
    before = [i for ev in tokens[:k] for i in ev["choices"][0]["token_ids"]]
    cont = continuation_from(tokens[k:], parsed(events[12]), COMPLETION_PROMPT, before)
    splicer = Splicer(
        endpoint=COMPLETIONS,
        identity=StreamIdentity.from_event(events[0]),
        prompt_tokens=len(COMPLETION_PROMPT),
        tokens_before=k,
        include_usage=True,
        continuous_usage=False,
        token_ids=True,
    )
    assert splicer.rewrite(cont) == b"".join(events[k:])
    assert splicer.completion_tokens == 12 and splicer.done


@pytest.mark.parametrize("k", [1, 6, 11])
def test_chat_continuation_reads_as_the_captured_vllm_stream(k: int) -> None:
    events = golden_events("chat_stream.txt")  # role, 12 token events, usage, [DONE]
    first = parsed(events[0])
    prompt = first["prompt_token_ids"]
    tokens = [parsed(e) for e in events[1:13]]
    before = [i for ev in tokens[:k] for i in ev["choices"][0]["token_ids"]]
    cont = continuation_from(tokens[k:], parsed(events[13]), prompt, before)
    splicer = Splicer(
        endpoint=CHAT,
        identity=StreamIdentity.from_event(events[0]),
        prompt_tokens=len(prompt),
        tokens_before=k,
        include_usage=True,
        continuous_usage=False,
        token_ids=True,
    )
    assert splicer.rewrite(cont) == b"".join(events[1 + k :])
    assert splicer.completion_tokens == 12


def test_without_token_ids_the_id_fields_go_and_the_rest_stays() -> None:
    events = golden_events("completion_stream.txt")
    tokens = [parsed(e) for e in events[:12]]
    before = [i for ev in tokens[:4] for i in ev["choices"][0]["token_ids"]]
    cont = continuation_from(tokens[4:], parsed(events[12]), COMPLETION_PROMPT, before)
    splicer = Splicer(
        endpoint=COMPLETIONS,
        identity=StreamIdentity.from_event(events[0]),
        prompt_tokens=7,
        tokens_before=4,
        include_usage=False,
        continuous_usage=True,  # meaningless without include_usage, as in vLLM
        token_ids=False,
    )
    out = [parsed(e) for e in EventBuffer().feed(splicer.rewrite(cont))[:-1]]
    assert len(out) == 8  # 8 token events; no usage event
    for got, want in zip(out, tokens[4:], strict=True):
        choice = dict(want["choices"][0])
        del choice["prompt_token_ids"], choice["token_ids"]
        assert got == {**want, "choices": [choice]}
        assert list(got["choices"][0]) == [
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "stop_reason",
        ]


# ---- against the simulator's ChunkWriter --------------------------------------------------------
PROMPT = [1, 40, 41, 42, 43]
# (token ids, text, finish_reason, stop_reason) per engine step; the last one ends on a stop
# token whose text is empty, so chat writes an empty delta.
STEPS: list[tuple[list[int], str, str | None, int | str | None]] = [
    ([500], "Hello", None, None),
    ([501, 502], ' "wor', None, None),
    ([503], "", None, None),  # a token whose text is held back
    ([504], "ld\u00e9\n", None, None),
    ([505], " again", None, None),
    ([2], "", "stop", 2),
]


def writer(
    kind: str, prompt: list[int], *, usage: bool, continuous: bool, ids: bool
) -> ChunkWriter:
    p = ParsedRequest(
        kind=kind,
        model="sim-llama-8b",
        prompt_ids=prompt,
        params=GenerationParams(max_tokens=32),
        stream=True,
        include_usage=usage,
        continuous_usage=continuous,
        return_token_ids=ids,
        kv_transfer_params=None,
    )
    prefix = "chatcmpl" if kind == SIM_CHAT else "cmpl"
    return ChunkWriter(p, f"{prefix}-{kind}-{len(prompt)}", prompt)


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("ids", [False, True])
@pytest.mark.parametrize(("usage", "continuous"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("cut", [1, 3, 5])
def test_spliced_stream_is_byte_identical_to_one_uninterrupted_stream(
    endpoint: str, ids: bool, usage: bool, continuous: bool, cut: int
) -> None:
    """The client's stream written by the simulator without a move equals the first leg's events
    followed by the splicer's rewrite of a completions continuation (token ids and usage on, as
    the proxy asks) started from the prompt + the ids generated before the cut."""
    kind = SIM_CHAT if endpoint == CHAT else SIM_COMPLETIONS
    client = writer(kind, PROMPT, usage=usage, continuous=continuous, ids=ids)
    whole: list[bytes] = []
    opening = client.opening()
    if opening is not None:
        whole.append(sse(opening))
    for step in STEPS:
        whole.append(client.token_bytes(*step))
    final = client.final_usage()
    if final is not None:
        whole.append(sse(final))
    whole.append(b"data: [DONE]\n\n")
    head = 1 if opening is not None else 0
    first_leg, tail = whole[: head + cut], whole[head + cut :]

    before = [t for ids_, *_ in STEPS[:cut] for t in ids_]
    backend = writer(SIM_COMPLETIONS, PROMPT + before, usage=True, continuous=False, ids=True)
    backend.created = client.created + 3
    cont = [backend.token_bytes(*step) for step in STEPS[cut:]]
    backend_final = backend.final_usage()
    assert backend_final is not None
    cont += [sse(backend_final), b"data: [DONE]\n\n"]

    splicer = Splicer(
        endpoint=endpoint,
        identity=StreamIdentity.from_event(first_leg[0]),
        prompt_tokens=len(PROMPT),
        tokens_before=len(before),
        include_usage=usage,
        continuous_usage=continuous,
        token_ids=ids,
    )
    assert splicer.rewrite(b"".join(cont)) == b"".join(tail)
    assert splicer.completion_tokens == client.completion_tokens == 7


def test_events_split_anywhere_give_the_same_output() -> None:
    events = golden_events("chat_stream.txt")
    prompt = parsed(events[0])["prompt_token_ids"]
    tokens = [parsed(e) for e in events[1:13]]
    before = tokens[0]["choices"][0]["token_ids"]
    cont = continuation_from(tokens[1:], parsed(events[13]), prompt, before)

    def splicer() -> Splicer:
        return Splicer(
            endpoint=CHAT,
            identity=StreamIdentity.from_event(events[1]),
            prompt_tokens=len(prompt),
            tokens_before=1,
            include_usage=True,
            continuous_usage=True,
            token_ids=False,
        )

    whole = splicer().rewrite(cont)
    s = splicer()
    pieces = [s.rewrite(cont[i : i + 37]) for i in range(0, len(cont), 37)]
    assert b"".join(pieces) == whole
    assert s.rewrite(b"") == b""
    out = [parsed(e) for e in EventBuffer().feed(whole)[:-1]]
    assert [ev["usage"]["completion_tokens"] for ev in out] == [*range(2, 13), 12]
    assert {ev["usage"]["prompt_tokens"] for ev in out} == {len(prompt)}
    assert all(
        ev["usage"]["total_tokens"] == len(prompt) + ev["usage"]["completion_tokens"] for ev in out
    )
    assert "system_fingerprint" in out[-1] and out[-1]["choices"] == []


def test_error_events_pass_unchanged_and_one_done_ends_the_stream() -> None:
    error = (
        b'data: {"error":{"message":"boom","type":"upstream_error","param":null,"code":502}}\n\n'
    )
    s = Splicer(
        endpoint=COMPLETIONS,
        identity=StreamIdentity("cmpl-x", 5, "m"),
        prompt_tokens=3,
        tokens_before=2,
        include_usage=True,
        continuous_usage=False,
        token_ids=False,
    )
    token = sse(
        {
            "id": "cmpl-b",
            "object": "text_completion",
            "created": 9,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "text": "x",
                    "logprobs": None,
                    "finish_reason": None,
                    "stop_reason": None,
                    "prompt_token_ids": [1, 2, 3, 4, 5],
                    "token_ids": [7, 8],
                }
            ],
        }
    )
    out = s.rewrite(token + error + b"data: [DONE]\n\n" + b"data: [DONE]\n\n" + token)
    want_token = (
        b'data: {"id":"cmpl-x","object":"text_completion","created":5,"model":"m","choices":'
        b'[{"index":0,"text":"x","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
    )
    assert out == want_token + error + b"data: [DONE]\n\n"
    assert s.rewrite(b"data: [DONE]\n\n") == b""
    assert s.completion_tokens == 4 and s.done


def test_stream_identity_from_a_first_event() -> None:
    event = golden_events("chat_stream.txt")[0]
    want = StreamIdentity("chatcmpl-b6d452b2ba107b9c", 1795319306, "tiny")
    assert StreamIdentity.from_event(event) == want
    assert StreamIdentity.from_event(event.rstrip(b"\n")) == want
    for bad in (b"data: [DONE]\n\n", b'data: {"error":{"message":"x"}}\n\n', b": ping\n\n"):
        with pytest.raises(ValueError):
            StreamIdentity.from_event(bad)
    with pytest.raises(ValueError):
        Splicer(
            endpoint="embeddings",
            identity=want,
            prompt_tokens=1,
            tokens_before=0,
            include_usage=False,
            continuous_usage=False,
            token_ids=False,
        )


def test_golden_manifest_pairs_the_stream_and_non_stream_captures() -> None:
    """The splice and assembly tests lean on these captures being the same request."""
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    for stream, whole in (
        ("completion_stream.txt", "completion.json"),
        ("chat_stream.txt", "chat.json"),
    ):
        req = dict(manifest[stream]["request"])
        assert req.pop("stream") is True and req.pop("stream_options") == {"include_usage": True}
        assert req == manifest[whole]["request"]


def test_the_final_usage_takes_the_continuations_own_count() -> None:
    """Token events without ids cannot be counted; B's usage event still counts them."""
    s = Splicer(
        endpoint=CHAT,
        identity=StreamIdentity("chatcmpl-x", 5, "m"),
        prompt_tokens=10,
        tokens_before=4,
        include_usage=True,
        continuous_usage=False,
        token_ids=False,
    )
    envelope = {"id": "cmpl-b", "object": "text_completion", "created": 9, "model": "m"}
    choice = {"index": 0, "text": "ab", "logprobs": None, "finish_reason": "length"}
    usage = {"prompt_tokens": 14, "total_tokens": 17, "completion_tokens": 3}
    out = s.rewrite(
        sse({**envelope, "choices": [{**choice, "stop_reason": None}]})
        + sse({**envelope, "choices": [], "usage": usage, "system_fingerprint": "fp"})
    )
    assert out == (
        b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":5,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"ab"},"logprobs":null,"finish_reason":"length",'
        b'"stop_reason":null}]}\n\n'
        b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":5,"model":"m",'
        b'"choices":[],"usage":{"prompt_tokens":10,"total_tokens":17,"completion_tokens":7},'
        b'"system_fingerprint":"fp"}\n\n'
    )
    assert s.completion_tokens == 7 and not s.done


def test_ids_the_client_already_has_are_not_sent_twice() -> None:
    """Cut after 5 tokens, the last 2 of which had no text yet: the continuation starts after
    token 3 and generates tokens 4-5 again; their ids reach the client once, their text once."""
    events = golden_events("completion_stream.txt")
    tokens = [parsed(e) for e in events[:12]]
    ids = [i for ev in tokens for i in ev["choices"][0]["token_ids"]]
    before = ids[:3]
    cont = continuation_from(tokens[3:], parsed(events[12]), COMPLETION_PROMPT, before)
    splicer = Splicer(
        endpoint=COMPLETIONS,
        identity=StreamIdentity.from_event(events[0]),
        prompt_tokens=len(COMPLETION_PROMPT),
        tokens_before=3,
        include_usage=True,
        continuous_usage=False,
        token_ids=True,
        resent_ids=2,
    )
    out = [parsed(e) for e in golden_events_of(splicer.rewrite(cont))]
    sent_after = [i for ev in out for c in ev["choices"] for i in c["token_ids"]]
    assert ids[:5] + sent_after == ids
    assert "".join(c["text"] for ev in out for c in ev["choices"]) == "".join(
        ev["choices"][0]["text"] for ev in tokens[3:]
    )
    assert out[-1]["usage"]["completion_tokens"] == 12


def golden_events_of(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip() and e != b"data: [DONE]"]
