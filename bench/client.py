"""The HTTP side of one request: aiohttp, streaming SSE, clock readings only.

aiohttp costs about a tenth of httpx's CPU per request (measured on a 2-core machine), which keeps
the load generator from being the bottleneck on a 2-core machine. Parsing is kept to what the
metrics need: whether a chunk carries content, the usage block, and the text (for history).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

BACKEND_HEADER = "x-fleet-backend"
# fleet-proxy's routing receipt: sent when the proxy runs with debug_receipts on and the request
# carries `x-fleet-debug: 1` (bench --header x-fleet-debug:1); other routers never send it.
DECISION_HEADER = "x-fleet-decision"
REQUEST_ID_HEADER = "x-request-id"


@dataclass(slots=True)
class RawResponse:
    sent: float
    end: float = 0.0
    content_times: list[float] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    status: int | None = None
    backend: str | None = None
    request_id: str | None = None
    decision: str | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


def decision_of(header: str | None) -> dict[str, Any] | None:
    """The routing receipt of an `x-fleet-decision` header; one that is not a JSON object is
    kept as its text under "unparsed" rather than dropped."""
    if header is None:
        return None
    try:
        obj = orjson.loads(header)
    except orjson.JSONDecodeError:
        obj = None
    return obj if isinstance(obj, dict) else {"unparsed": header}


def _chunk_text(obj: Mapping[str, Any]) -> str:
    choices = obj.get("choices") or ()
    if not choices:
        return ""
    c = choices[0]
    delta = c.get("delta")
    if delta is not None:  # chat
        return str(delta.get("content") or "") + str(delta.get("reasoning_content") or "")
    return str(c.get("text") or "")  # completions


async def stream_request(
    http: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    timeout_s: float,
    keep_text: bool,
) -> RawResponse:
    """POST `body` with stream=true and read the SSE stream to [DONE] or error."""
    payload = orjson.dumps(body)
    raw = RawResponse(sent=time.perf_counter())
    try:
        async with asyncio.timeout(timeout_s):
            async with http.post(
                url, data=payload, headers={"content-type": "application/json", **headers}
            ) as resp:
                raw.status = resp.status
                raw.backend = resp.headers.get(BACKEND_HEADER)
                raw.request_id = resp.headers.get(REQUEST_ID_HEADER)
                raw.decision = resp.headers.get(DECISION_HEADER)
                if resp.status != 200:
                    detail = (await resp.read())[:200].decode("utf-8", "replace")
                    raw.error = f"http {resp.status}: {detail}"
                    return raw
                done = False
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    obj = orjson.loads(data)
                    if "error" in obj and not obj.get("choices"):
                        raw.error = f"stream error: {str(obj['error'])[:200]}"
                        return raw
                    piece = _chunk_text(obj)
                    if piece:
                        raw.content_times.append(time.perf_counter())
                        if keep_text:
                            raw.text_parts.append(piece)
                    if obj.get("usage"):
                        raw.usage = obj["usage"]
                if not done:
                    raw.error = "stream ended before [DONE]"
    except TimeoutError:
        raw.error = "timeout"
    except aiohttp.ClientError as e:
        raw.error = f"{type(e).__name__}: {e}"[:200]
    except (ValueError, TypeError, AttributeError, KeyError) as e:  # orjson's error is a
        raw.error = f"bad SSE payload: {e}"[:200]  # ValueError; the others, odd JSON shapes
    finally:
        raw.end = time.perf_counter()
    return raw
