"""The routing context of one OpenAI request, from its body parsed once and its headers: what
the proxy's own data plane and the gateway's endpoint picker both route by."""

from __future__ import annotations

from collections.abc import Mapping

from fleet.tokens import estimate_tokens
from policies.policy import RequestContext
from proxy.request.body import (
    chat_prompt,
    completion_prompt,
    is_stream,
    parse_object,
    require_model,
)


def request_context(
    endpoint: str,
    generates: bool,
    body: bytes,
    headers: Mapping[str, str],
    request_id: str,
    *,
    chars_per_token: float,
    session_header: str | None,
    session_field: str | None,
    debug: bool,
) -> RequestContext:
    """Raises ProxyError(400) for a body the engines would refuse."""
    parsed = parse_object(body)
    model = require_model(parsed)
    token_count: int | None = None
    if endpoint == "completions":
        text, token_count = completion_prompt(parsed)
    elif endpoint == "chat/completions":
        text = chat_prompt(parsed)
    else:
        text = ""
    stream = is_stream(parsed) if generates else False
    is_ids = token_count is not None
    if token_count is None:
        token_count = estimate_tokens(text, chars_per_token)
    session_id = headers.get(session_header) if session_header else None
    if session_id is None and session_field:
        value = parsed.get(session_field)
        session_id = value if isinstance(value, str) else None
    return RequestContext(
        request_id=request_id,
        endpoint=endpoint,
        model=model,
        body=parsed,
        headers=headers,
        stream=stream,
        prompt_text=text,
        prompt_tokens=token_count,
        session_id=session_id,
        program_id=headers.get("x-program-id") or session_id,
        debug=debug and headers.get("x-fleet-debug") == "1",
        prompt_is_token_ids=is_ids,
    )
