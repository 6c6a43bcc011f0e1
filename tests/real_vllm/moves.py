"""Helpers of the real-vLLM move tests: read a stream through the proxy, with its token ids."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

TOTAL = 40
GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": TOTAL, "stream": True}


@dataclass
class Read:
    backend: str
    request_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    done: int = 0

    @property
    def text(self) -> str:
        return "".join(
            c.get("text") or (c.get("delta") or {}).get("content") or ""
            for e in self.events
            for c in e.get("choices", [])
        )

    @property
    def token_ids(self) -> list[int]:
        return [
            t for e in self.events for c in e.get("choices", []) for t in c.get("token_ids") or []
        ]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if "error" in e]


def body(model: str, endpoint: str, tokens: int = TOTAL) -> dict[str, Any]:
    if endpoint == "/v1/completions":
        prompt: dict[str, Any] = {"prompt": "The morning light on the stone road was"}
    else:
        prompt = {"messages": [{"role": "user", "content": "Describe the stone road at dawn."}]}
    return {"model": model, **prompt, **GREEDY, "max_tokens": tokens, "return_token_ids": True}


async def read_stream(
    client: httpx.AsyncClient,
    url: str,
    request: dict[str, Any],
    *,
    after: int = -1,
    action: Callable[[Read], Awaitable[None]] | None = None,
) -> Read:
    """Read a streamed answer whole; `action` runs once `after` data events arrived."""
    async with client.stream("POST", url, json=request) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        out = Read(r.headers.get("x-fleet-backend", ""), r.headers.get("x-request-id", ""))
        buf = b""
        async for chunk in r.aiter_bytes():
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                if event == b"data: [DONE]":
                    out.done += 1
                    continue
                out.events.append(orjson.loads(event[6:]))
                if action is not None and len(out.events) == after:
                    await action(out)
        return out
