"""What the proxy adds to a movable request so that its stream can continue elsewhere: the
token ids it asks the backend for, the ledger and assembler that track the answer, the splicer
that joins a continuation to the client's stream, and the ending a stream that lost it still
owes its client. Pure: no I/O, nothing kept between requests."""

from __future__ import annotations

from typing import Any

import orjson

from policies.policy import RequestContext
from proxy.stream.assembled_answer import Assembler
from proxy.stream.continuation import Movability
from proxy.stream.splice import Splicer, StreamIdentity, finish_event, usage_event
from proxy.stream.token_ledger import TokenLedger

_CHAT = "chat/completions"


def tracked_request(
    ctx: RequestContext,
    body: bytes,
    movability: Movability | None,
    client_ids: bool,
    max_answer_bytes: int,
) -> tuple[bytes, dict[str, Any], TokenLedger | None, Assembler | None]:
    """What the first leg sends and what tracks its answer: its body, the fields the proxy adds
    to the client's, the token ledger of a movable request, the assembler of a movable
    answer the client wants whole (holding at most `max_answer_bytes` of its stream).
    `client_ids`: the client asked for token ids itself."""
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
    assembler = Assembler(endpoint=ctx.endpoint, token_ids=client_ids, max_bytes=max_answer_bytes)
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


def lost_ending(
    ctx: RequestContext, ledger: TokenLedger, *, assembled: bool, strip: bool, at_limit: bool
) -> bytes:
    """The events a stream broken after its last token still owes its client before its
    [DONE]: a last event finishing it for "length" when it stopped at its limit without one
    (`at_limit`), then the usage event when the client asked for one and it never came, counted
    from the ledger. `strip`: the client did not ask for token ids."""
    if not ledger.first_event:
        return b""
    try:
        ident = StreamIdentity.from_event(ledger.first_event)
    except ValueError:
        return b""  # not a stream the proxy can speak for
    endpoint = ctx.endpoint
    out = finish_event(endpoint, ident, "length", token_ids=not strip) if at_limit else b""
    options = ctx.body.get("stream_options")
    wants_usage = assembled or (isinstance(options, dict) and options.get("include_usage") is True)
    if wants_usage and not ledger.usage_seen:
        prompt = ledger.prompt_ids() or []
        out += usage_event(endpoint, ident, len(prompt), len(ledger.generated))
    return out


def _with_token_ids(raw: bytes, parsed: dict[str, Any]) -> bytes:
    """The client's body asking vLLM for token ids too, its own bytes kept where possible."""
    if "return_token_ids" in parsed:
        return orjson.dumps({**parsed, "return_token_ids": True})
    brace = raw.find(b"{")
    return raw[: brace + 1] + b'"return_token_ids":true,' + raw[brace + 1 :]
