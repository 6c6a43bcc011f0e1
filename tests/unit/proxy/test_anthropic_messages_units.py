"""The Messages API's pure parts: the Anthropic error shape, a request's prompt text for
routing, and the key a request presents."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import ProxyError, error_body
from proxy.request.anthropic_errors import (
    anthropic_error,
    anthropic_shaped,
    error_type,
    stream_error_event,
)
from proxy.request.body import chat_prompt, messages_prompt
from proxy.serving.access import presented_credential
from proxy.stream.messages_stream import MessagesAligner, last_event_name


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (431, "invalid_request_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_each_status_has_its_anthropic_error_type(status: int, kind: str) -> None:
    assert error_type(status) == kind
    assert orjson.loads(anthropic_error(status, "why")) == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }


def test_a_proxy_error_in_openai_shape_keeps_its_message() -> None:
    openai = ProxyError(404, "The model `x` does not exist.", type="not_found_error").body()
    assert orjson.loads(anthropic_shaped(404, openai) or b"") == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "The model `x` does not exist."},
    }
    refused = error_body("no healthy backend serves model `m` right now", "x", None, 503)
    assert orjson.loads(anthropic_shaped(503, refused) or b"")["error"] == {
        "type": "overloaded_error",
        "message": "no healthy backend serves model `m` right now",
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"detail": "Not Found"}', "Not Found"),  # FastAPI's, a path an engine lacks
        (b'{"error": "Unauthorized"}', "Unauthorized"),  # vLLM's refused key
        (b"Bad Request", "Bad Request"),  # plain text from a server before its API layer
        (b"", "error 400"),
        # vLLM's own Messages error: its OpenAI type in Anthropic's envelope.
        (b'{"type":"error","error":{"type":"BadRequestError","message":"no"}}', "no"),
    ],
)
def test_other_error_bodies_are_put_in_anthropics_shape(body: bytes, message: str) -> None:
    assert orjson.loads(anthropic_shaped(400, body) or b"") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }


def test_an_answer_in_anthropics_shape_already_is_left_as_it_is() -> None:
    assert anthropic_shaped(404, anthropic_error(404, "gone")) is None


def test_the_stream_error_event_is_an_anthropic_event() -> None:
    event = stream_error_event("cut")
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    assert orjson.loads(event.split(b"data: ", 1)[1]) == {
        "type": "error",
        "error": {"type": "api_error", "message": "cut"},
    }


def test_the_prompt_text_is_the_system_text_then_the_messages_as_chats() -> None:
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hi"}]},
        {
            "role": "user",
            "content": [{"type": "image", "source": {}}, {"type": "text", "text": "?"}],
        },
    ]
    chat = chat_prompt({"messages": messages})
    assert messages_prompt({"messages": messages}) == chat
    assert messages_prompt({"messages": messages, "system": "Be terse."}) == (
        "system:Be terse.\n" + chat
    )
    blocks = [{"type": "text", "text": "Be "}, {"type": "text", "text": "terse."}]
    assert messages_prompt({"messages": messages, "system": blocks}) == (
        "system:Be terse.\n" + chat
    )


def test_claude_codes_attribution_block_is_not_routing_text() -> None:
    # It changes on every request; vLLM leaves it out of the prompt too.
    blocks = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=8f3e;"},
        {"type": "text", "text": "You are Claude Code."},
    ]
    messages = [{"role": "user", "content": "hi"}]
    assert messages_prompt({"system": blocks, "messages": messages}) == messages_prompt(
        {"system": "You are Claude Code.", "messages": messages}
    )


def test_a_conversation_s_next_turn_extends_its_prompt_text() -> None:
    first = {"system": "S", "messages": [{"role": "user", "content": "a"}]}
    second = {
        "system": "S",
        "messages": [*first["messages"], {"role": "assistant", "content": "b"}],  # type: ignore[list-item]
    }
    assert messages_prompt(second).startswith(messages_prompt(first))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "'messages' is required"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": "x"}], "system": 3}, "'system'"),
    ],
)
def test_a_malformed_request_is_refused_with_400(body: dict[str, object], says: str) -> None:
    with pytest.raises(ProxyError) as refused:
        messages_prompt(body)
    assert refused.value.status == 400 and says in refused.value.message


def test_the_key_is_read_from_authorization_else_from_x_api_key() -> None:
    assert presented_credential({"authorization": "Bearer a"}) == "Bearer a"
    assert presented_credential({"x-api-key": "b"}) == "Bearer b"
    # Authorization wins: a client sending both meant it.
    assert presented_credential({"authorization": "Bearer a", "x-api-key": "b"}) == "Bearer a"
    assert presented_credential({}) is None


def test_the_last_events_name_is_read_from_its_event_line() -> None:
    stop = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    delta = b'event: content_block_delta\ndata: {"text":"event: message_stop\\n"}\n\n'
    assert last_event_name(stop) == b"message_stop"
    assert last_event_name(stop + delta) == b"content_block_delta"  # data is never a field
    assert last_event_name(b"data: [DONE]\n\n") == b""


def test_the_aligner_knows_whether_the_stream_reached_its_end() -> None:
    aligner = MessagesAligner(1 << 20)
    assert aligner.feed(b"event: message_start\ndata: {}\n\nevent: message_st") != b""
    assert not aligner.complete
    assert aligner.feed(b'op\ndata: {"type":"message_stop"}\n\n').startswith(b"event: message_stop")
    assert aligner.complete
    aligner = MessagesAligner(1 << 20)
    aligner.feed(b'event: error\ndata: {"type":"error"}\n\n')
    assert aligner.complete  # the engine's own error ends it too
