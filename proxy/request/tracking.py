"""What the proxy adds to a movable request so that its stream can continue elsewhere: the
token ids it asks the backend for, the ledger and assembler that track the answer, the splicer
that joins a continuation to the client's stream, and the usage a stream that lost its ending
still owes its client. Pure: no I/O, nothing kept between requests."""

from __future__ import annotations

from typing import Any

import orjson

from policies.policy import RequestContext
from proxy.stream.assembled_answer import Assembler
from proxy.stream.continuation import Movability
from proxy.stream.splice import Splicer, StreamIdentity
from proxy.stream.token_ledger import TokenLedger

_CHAT = "chat/completions"


def tracked_request(
    ctx: RequestContext, body: bytes, movability: Movability | None, client_ids: bool
) -> tuple[bytes, dict[str, Any], TokenLedger | None, Assembler | None]:
    """What the first leg sends and what tracks its answer: its body, the fields the proxy adds
    to the client's, the token ledger of a movable request, the assembler of a movable
    answer the client wants whole. `client_ids`: the client asked for token ids itself."""
    if movability is None or not movability.movable:
        return body, {}, None, None
    ledger = TokenLedger()
    ledger.start_leg(strip=not client_ids, chat=ctx.endpoint == _CHAT)
    if ctx.stream:
        if client_ids:
            return body, {}, ledger, None
        return _with_token_ids(body, ctx.body), {"return_token_ids": True}, ledger, None
    # Streamed from the backend and answered whole: the request can move.
    fields: dict[str, Any] = {
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    assembler = Assembler(endpoint=ctx.endpoint, token_ids=client_ids)
    return orjson.dumps({**ctx.body, **fields}), fields, ledger, assembler


def spliced_stream(
    ctx: RequestContext,
    ledger: TokenLedger,
    prompt_tokens: int,
    tokens: int,
    resent: int,
    *,
    assembled: bool,
    strip: bool,
) -> Splicer:
    """The splicer of a continuation's stream into the client's (proxy/stream/splice.py)."""
    options = ctx.body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    continuous = isinstance(options, dict) and options.get("continuous_usage_stats") is True
    return Splicer(
        endpoint=ctx.endpoint,
        identity=StreamIdentity.from_event(ledger.first_event),
        prompt_tokens=prompt_tokens,
        tokens_before=tokens,
        include_usage=include_usage or assembled,
        continuous_usage=continuous,
        token_ids=not strip,
        resent_ids=resent,
    )


def lost_usage(ctx: RequestContext, ledger: TokenLedger, *, assembled: bool) -> bytes:
    """The usage event a stream broken after its last token still owes its client (when the
    client asked for one and it never came), counted from the ledger; else nothing."""
    options = ctx.body.get("stream_options")
    wants_usage = assembled or (isinstance(options, dict) and options.get("include_usage") is True)
    if not wants_usage or ledger.usage_seen or not ledger.first_event:
        return b""
    ident = StreamIdentity.from_event(ledger.first_event)
    prompt = ledger.prompt_ids() or []
    completion = len(ledger.generated)
    event: dict[str, Any] = {
        "id": ident.id,
        "object": "chat.completion.chunk" if ctx.endpoint == _CHAT else "text_completion",
        "created": ident.created,
        "model": ident.model,
        "choices": [],
        "usage": {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + completion,
            "completion_tokens": completion,
        },
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


def _with_token_ids(raw: bytes, parsed: dict[str, Any]) -> bytes:
    """The client's body asking vLLM for token ids too, its own bytes kept where possible."""
    if "return_token_ids" in parsed:
        return orjson.dumps({**parsed, "return_token_ids": True})
    brace = raw.find(b"{")
    return raw[: brace + 1] + b'"return_token_ids":true,' + raw[brace + 1 :]
