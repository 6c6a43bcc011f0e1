"""Prefill/decode disaggregation on the wire.

Two ways to carry out a Decision that names a prefill backend:
- header mode (the llm-d contract): the request goes to the decode backend with
  `x-prefiller-host-port: host:port`; a sidecar there runs the prefill leg;
- orchestrated mode (vLLM's NixlConnector, as vLLM's own proxies do it): this proxy sends the
  prefill leg (`max_tokens: 1`, not streamed, `kv_transfer_params.do_remote_decode`) and
  hands the returned `kv_transfer_params` to the decode leg, which streams to the client.
If the prefill leg fails or times out, the decode backend does the prefill itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson

from fleet.types import Backend
from proxy.backends.accounting import Dispatch
from proxy.backends.kv_transfer import remote_decode_params
from proxy.backends.upstream import Upstream, UpstreamError

log = logging.getLogger("fleet_proxy.disagg")

PREFILLER_HEADER = b"x-prefiller-host-port"


def host_port(backend: Backend) -> str:
    return urlsplit(backend.url).netloc


def _one_token(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> bytes:
    leg = dict(body)
    leg["stream"] = False
    leg["max_tokens"] = 1
    if "max_completion_tokens" in leg:
        leg["max_completion_tokens"] = 1
    leg.pop("stream_options", None)
    leg["kv_transfer_params"] = kv_transfer_params
    return orjson.dumps(leg)


def prefill_body(body: dict[str, Any]) -> bytes:
    return _one_token(body, remote_decode_params())


def pull_body(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> bytes:
    """A 1-token request that pulls the KV named by `kv_transfer_params`; its answer is of no
    use, the pulled blocks stay in the engine's prefix cache."""
    return _one_token(body, kv_transfer_params)


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> bytes:
    return orjson.dumps({**body, "kv_transfer_params": kv_transfer_params})


class PrefillFailed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


async def run_prefill_leg(
    pool: Upstream,
    prefill: Backend,
    origin: str,
    path: str,
    body: dict[str, Any],
    headers: Sequence[tuple[bytes, bytes]],
    prompt_tokens: int,
    limit_s: float,
) -> dict[str, Any]:
    """POST the prefill leg to `origin` + `path` (on `prefill`); return the
    kv_transfer_params the decode leg needs."""
    data = await run_one_token_leg(
        pool, prefill, origin, path, prefill_body(body), headers, prompt_tokens, limit_s
    )
    try:
        params = orjson.loads(data).get("kv_transfer_params")
    except (orjson.JSONDecodeError, AttributeError):
        raise PrefillFailed("bad_response", f"{prefill.id} answered no JSON object") from None
    if not isinstance(params, dict):
        raise PrefillFailed("bad_response", f"{prefill.id} returned no kv_transfer_params")
    return params


async def run_one_token_leg(
    pool: Upstream,
    backend: Backend,
    origin: str,
    path: str,
    body: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    prompt_tokens: int,
    limit_s: float,
) -> bytes:
    """POST a non-streamed leg the client never sees; its answer's body when it is a 200."""
    dispatch = Dispatch(backend.load, prompt_tokens)
    try:
        async with asyncio.timeout(limit_s):
            async with await pool.request(origin, path, headers, body) as resp:
                data = await resp.read()
                if resp.status != 200:
                    raise PrefillFailed("status", f"{backend.id} answered HTTP {resp.status}")
        return data
    except UpstreamError as e:
        reason = "timeout" if e.kind == "timeout" else "connect"
        raise PrefillFailed(reason, f"{backend.id}: {e}") from None
    except TimeoutError:
        raise PrefillFailed("timeout", f"{backend.id} took over {limit_s:g}s") from None
    finally:
        dispatch.release()
