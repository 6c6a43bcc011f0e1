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
    messages_prompt,
    parse_object,
    require_model,
)
from proxy.settings import Settings


class ContextReader:
    """Reads requests' routing contexts as the settings say: the prompt's token estimate, where
    a session id comes from, whether decision receipts may be asked for."""

    __slots__ = ("_chars_per_token", "_debug", "_session_field", "_session_header")

    def __init__(self, settings: Settings, *, debug: bool) -> None:
        self._chars_per_token = settings.chars_per_token
        self._session_header = settings.session_header
        self._session_field = settings.session_body_field
        self._debug = debug

    def read(
        self,
        endpoint: str,
        generates: bool,
        body: bytes,
        headers: Mapping[str, str],
        request_id: str,
    ) -> RequestContext:
        """Raises ProxyError(400) for a body the engines would refuse."""
        parsed = parse_object(body)
        model = require_model(parsed)
        token_count: int | None = None
        if endpoint == "completions":
            text, token_count = completion_prompt(parsed)
        elif endpoint == "chat/completions":
            text = chat_prompt(parsed)
        elif endpoint == "messages":
            text = messages_prompt(parsed)
        elif endpoint == "messages/count_tokens":
            # Checked as a Messages request is, but no routing text: counting computes no
            # KV, so a prefix index must not learn that its engine holds the prompt.
            messages_prompt(parsed)
            text = ""
        else:
            text = ""
        stream = is_stream(parsed) if generates else False
        is_ids = token_count is not None
        if token_count is None:
            token_count = estimate_tokens(text, self._chars_per_token)
        session_header = self._session_header
        session_id = headers.get(session_header) if session_header else None
        if session_id is None and self._session_field:
            value = parsed.get(self._session_field)
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
            debug=self._debug and headers.get("x-fleet-debug") == "1",
            prompt_is_token_ids=is_ids,
        )
