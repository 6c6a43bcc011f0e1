"""Legs that move KV between backends instead of answering a client: a P/D decision's prefill
leg, a move's 1-token leg on its source that offers the KV, and a pre-copy's pull of that KV
into its target's prefix cache (proxy/backends/disagg.py runs them)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fleet.types import Backend
from policies.policy import Decision, RequestContext
from proxy.backends.disagg import (
    PREFILLER_HEADER,
    PrefillFailed,
    decode_body,
    host_port,
    pull_body,
    run_one_token_leg,
    run_prefill_leg,
)
from proxy.ports import RequestServices
from proxy.request.legs import GENERATION
from proxy.request.upstream_targets import UpstreamTargets

log = logging.getLogger("fleet_proxy.legs")


class KvLegs:
    __slots__ = ("_core", "_targets")

    def __init__(self, core: RequestServices, targets: UpstreamTargets) -> None:
        self._core = core
        self._targets = targets

    async def prefill_elsewhere(
        self,
        ctx: RequestContext,
        decision: Decision,
        path: str,
        body: bytes,
        body_fields: Mapping[str, Any],
        headers: list[tuple[bytes, bytes]],
    ) -> tuple[Backend | None, bytes, list[tuple[bytes, bytes]], int | None]:
        """Carry out the prefill leg of a disaggregated decision.

        Returns the prefill backend used (None: prefill on the target), the body and headers
        for the target, and the prompt tokens to charge there (None: unchanged).
        `body_fields` are the fields the proxy adds to the client's body on the target."""
        prefill = decision.prefill
        if prefill is None or ctx.endpoint not in GENERATION:
            return None, body, headers, None
        core = self._core
        settings = core.settings
        if settings.pd_mode == "header":
            hint = (PREFILLER_HEADER, host_port(prefill).encode("latin-1"))
            return prefill, body, [*headers, hint], None
        leg_tokens = decision.prefill_leg_tokens
        origin, full_path = self._targets.target(prefill, path)
        try:
            kv = await run_prefill_leg(
                core.upstream_pool(), prefill, origin, full_path, ctx.body, headers,
                ctx.prompt_tokens if leg_tokens is None else leg_tokens,
                settings.pd_prefill_timeout,
            )  # fmt: skip
        except PrefillFailed as e:
            # Fall back to prefilling on the decode backend: slower, never lost.
            core.metrics.pd_prefill_legs.labels(e.reason).inc()
            log.warning("request %s: prefill leg failed (%s)", ctx.request_id, e)
            return None, body, headers, None
        core.metrics.pd_prefill_legs.labels("ok").inc()
        # The decode backend pulls the KV instead of computing it.
        target_body = {**ctx.body, **body_fields} if body_fields else ctx.body
        return prefill, decode_body(target_body, kv), headers, 0

    async def kv_from(
        self,
        backend: Backend,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: dict[str, Any],
        tokens: int,
        kind: str,
    ) -> dict[str, Any] | None:
        """The kv_transfer_params of a 1-token `do_remote_decode` leg of `body` on `backend`
        (which then holds those blocks for a pull); None when it failed."""
        core = self._core
        origin, full_path = self._targets.target(backend, path)
        try:
            kv = await run_prefill_leg(
                core.upstream_pool(), backend, origin, full_path, body, headers, tokens,
                core.settings.pd_prefill_timeout,
            )  # fmt: skip
        except PrefillFailed as e:
            core.metrics.migration_kv_legs.labels(kind, e.reason).inc()
            log.warning("%s KV leg on %s failed (%s)", kind, backend.id, e)
            return None
        core.metrics.migration_kv_legs.labels(kind, "ok").inc()
        return kv

    async def pull_kv(
        self,
        backend: Backend,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: dict[str, Any],
        kv: dict[str, Any],
        tokens: int,
    ) -> bool:
        """Have `backend` pull the KV `kv` names into its prefix cache (a 1-token leg whose
        answer is dropped); False when it failed."""
        core = self._core
        origin, full_path = self._targets.target(backend, path)
        try:
            await run_one_token_leg(
                core.upstream_pool(), backend, origin, full_path, pull_body(body, kv),
                headers, tokens, core.settings.pd_prefill_timeout,
            )  # fmt: skip
        except PrefillFailed as e:
            core.metrics.migration_kv_legs.labels("precopy", f"pull_{e.reason}").inc()
            log.warning("pre-copy pull on %s failed (%s)", backend.id, e)
            return False
        core.metrics.migration_kv_legs.labels("precopy", "pull_ok").inc()
        return True
