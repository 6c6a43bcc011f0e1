"""One backend leg of a client request: choose a backend, run a P/D prefill leg if the
decision names one, and open the upstream request.

A leg that fails before its answer's status line raises `RetryableUpstream` (or a 5xx answer,
read and closed): nothing of it reached the client, so the session may try another backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import orjson

from fleet.types import Backend
from policies.policy import Decision, NoCandidate, RequestContext
from proxy.backends.disagg import (
    PREFILLER_HEADER,
    PrefillFailed,
    decode_body,
    host_port,
    pull_body,
    run_one_token_leg,
    run_prefill_leg,
)
from proxy.backends.upstream import (
    UpstreamError,
    UpstreamResponse,
    failure_kind,
    split_url,
)
from proxy.errors import FailureKind, ProxyError
from proxy.ports import RequestServices
from proxy.stream.move_kinds import transfers_kv

log = logging.getLogger("fleet_proxy.legs")

# Answers that say "this backend, now" rather than "this request": safe to try elsewhere.
RETRYABLE_STATUS = frozenset({500, 502, 503, 504})

GENERATION = frozenset({"completions", "chat/completions"})

# The reason of a decision the policy did not make (a planned move to a named backend).
CALLER_CHOSEN = "chosen by the caller"


class RetryableUpstream(Exception):
    """A backend failed before anything of its answer reached the client."""

    def __init__(self, backend: Backend, kind: FailureKind, detail: str) -> None:
        super().__init__(f"{backend.id}: {detail}")
        self.backend = backend
        self.kind: FailureKind = kind


class Leg:
    """One backend's part of a client request: its decision and its open response."""

    __slots__ = (
        "backend",
        "closed",
        "decision",
        "kind",
        "opened_at",
        "prefill",
        "reason",
        "resp",
        "tokens_before",
    )

    def __init__(
        self,
        decision: Decision,
        prefill: Backend | None,
        resp: UpstreamResponse,
        reason: str,
        tokens_before: int,
        kind: str = "",
    ) -> None:
        self.decision = decision
        # How a continuation's KV reached it (proxy/stream/move_kinds.py); "" for a first leg.
        self.kind = kind
        self.backend = decision.target
        self.prefill = prefill
        self.resp = resp
        self.reason = reason  # why this leg exists: "first", "backend_failed", "admin"...
        self.tokens_before = tokens_before  # generated tokens the client had when it began
        self.opened_at = time.perf_counter()
        self.closed = False  # its response released and the policy told

    def receipt(self) -> dict[str, Any]:
        return {
            "backend": self.backend.id,
            "prefill": self.prefill.id if self.prefill is not None else None,
            "reason": self.reason,
            "tokens_before": self.tokens_before,
            "kind": self.kind or None,
        }


class LegOpener:
    """What every leg needs from the proxy: the fleet, the policy, the upstream pool."""

    def __init__(self, core: RequestServices) -> None:
        self.core = core
        self.settings = core.settings
        self._splits: dict[str, tuple[str, str]] = {}  # backend URL -> (origin, path prefix)
        core.fleet.on_removed(lambda _: self._splits.clear())  # rebuilt as requests come

    def choose(
        self,
        ctx: RequestContext,
        exclude: Collection[str],
        *,
        first: bool,
        required: Backend | None = None,
    ) -> Decision:
        """The policy's pick among routable backends serving the model, not in `exclude`.

        For a first leg, when every candidate was excluded (tried), a healthy one again: a lone
        backend that timed out once deserves a second chance. A continuation never goes back.
        """
        core = self.core
        now = core.clock.now()
        candidates = core.fleet.candidates(ctx.model, now)
        if required is not None:
            if not any(b is required for b in candidates):
                raise _unavailable(f"backend {required.id} cannot take requests for this model now")
            return Decision(target=required, reason=CALLER_CHOSEN)
        if exclude:
            others = [b for b in candidates if b.id not in exclude]
            candidates = others or (candidates if first else others)
        if not candidates:
            if (
                first
                and not exclude
                and core.fleet.routable(now)
                and not core.fleet.knows_model(ctx.model)
            ):
                raise ProxyError(
                    404,
                    f"The model `{ctx.model}` does not exist.",
                    type="not_found_error",
                    param="model",
                    code="model_not_found",
                )
            raise _unavailable(f"no healthy backend serves model `{ctx.model}` right now")
        try:
            return core.policy.pick(ctx, candidates, now)
        except NoCandidate as e:
            raise _unavailable(str(e)) from None

    def can_take(self, backend: Backend, model: str) -> bool:
        """Whether `backend` may take a new request for `model` now."""
        core = self.core
        return any(b is backend for b in core.fleet.candidates(model, core.clock.now()))

    def has_other(self, backend: Backend, model: str) -> bool:
        """Whether a backend other than `backend` may take a new request for `model` now."""
        core = self.core
        return any(b is not backend for b in core.fleet.candidates(model, core.clock.now()))

    def transfers_kv(self, backend: Backend) -> bool:
        """Whether `backend` sends and receives KV over NIXL (its `kv_connector` label)."""
        return transfers_kv(backend.spec.labels)

    def others_transfer_kv(self, backend: Backend, model: str) -> bool:
        """Whether a backend other than `backend` that may take `model` now transfers KV."""
        core = self.core
        return any(
            b is not backend and transfers_kv(b.spec.labels)
            for b in core.fleet.candidates(model, core.clock.now())
        )

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
        origin, full_path = self.target(backend, path)
        try:
            kv = await run_prefill_leg(
                self.core.upstream_pool(), backend, origin, full_path, body, headers, tokens,
                self.settings.pd_prefill_timeout,
            )  # fmt: skip
        except PrefillFailed as e:
            self.core.metrics.migration_kv_legs.labels(kind, e.reason).inc()
            log.warning("%s KV leg on %s failed (%s)", kind, backend.id, e)
            return None
        self.core.metrics.migration_kv_legs.labels(kind, "ok").inc()
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
        origin, full_path = self.target(backend, path)
        try:
            await run_one_token_leg(
                self.core.upstream_pool(), backend, origin, full_path, pull_body(body, kv),
                headers, tokens, self.settings.pd_prefill_timeout,
            )  # fmt: skip
        except PrefillFailed as e:
            self.core.metrics.migration_kv_legs.labels("precopy", f"pull_{e.reason}").inc()
            log.warning("pre-copy pull on %s failed (%s)", backend.id, e)
            return False
        self.core.metrics.migration_kv_legs.labels("precopy", "pull_ok").inc()
        return True

    def target(self, backend: Backend, path: str) -> tuple[str, str]:
        """The origin and full path of `path` on `backend` (its URL may carry a prefix)."""
        split = self._splits.get(backend.url)
        if split is None:
            split = self._splits[backend.url] = split_url(backend.url)
        origin, prefix = split
        return origin, prefix + path

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
        if self.settings.pd_mode == "header":
            hint = (PREFILLER_HEADER, host_port(prefill).encode("latin-1"))
            return prefill, body, [*headers, hint], None
        leg_tokens = decision.prefill_leg_tokens
        origin, full_path = self.target(prefill, path)
        try:
            kv = await run_prefill_leg(
                self.core.upstream_pool(), prefill, origin, full_path, ctx.body, headers,
                ctx.prompt_tokens if leg_tokens is None else leg_tokens,
                self.settings.pd_prefill_timeout,
            )  # fmt: skip
        except PrefillFailed as e:
            # Fall back to prefilling on the decode backend: slower, never lost.
            self.core.metrics.pd_prefill_legs.labels(e.reason).inc()
            log.warning("request %s: prefill leg failed (%s)", ctx.request_id, e)
            return None, body, headers, None
        self.core.metrics.pd_prefill_legs.labels("ok").inc()
        # The decode backend pulls the KV instead of computing it.
        target_body = {**ctx.body, **body_fields} if body_fields else ctx.body
        return prefill, decode_body(target_body, kv), headers, 0

    async def request(
        self,
        backend: Backend,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        on_sent: Callable[[UpstreamResponse], None] | None = None,
    ) -> UpstreamResponse:
        """Open `path` on `backend`; a failure before the status line, or a 5xx answer, is a
        `RetryableUpstream`. `on_sent`: see UpstreamPool.request."""
        origin, full_path = self.target(backend, path)
        try:
            resp = await self.core.upstream_pool().request(
                origin, full_path, headers, body, on_sent=on_sent
            )
        except UpstreamError as e:
            raise RetryableUpstream(backend, failure_kind(e), str(e)) from None
        status = resp.status
        if status in RETRYABLE_STATUS:
            try:
                detail = (await resp.read())[:300].decode("utf-8", "replace")
            except UpstreamError as e:
                detail = str(e)
            finally:
                resp.release()
            raise RetryableUpstream(backend, "status", f"HTTP {status}: {detail}")
        return resp

    def succeeded(self, backend: Backend) -> None:
        self.core.health.succeeded(backend)

    def failed_mid_stream(self, backend: Backend, kind: FailureKind, detail: str) -> None:
        self.core.health.failed_mid_stream(backend, kind, detail)

    def note_failure(self, request_id: str, e: RetryableUpstream, attempt: int, age: float) -> None:
        log.warning(
            "request %s: attempt %d on %s failed after %.2fs (%s): %s",
            request_id, attempt, e.backend.id, age, e.kind, e,
        )  # fmt: skip
        self.core.health.failed_before_answer(e.backend, e.kind, str(e))


def _unavailable(message: str) -> ProxyError:
    return ProxyError(
        503, message, type="service_unavailable", code=503, headers=[(b"retry-after", b"1")]
    )


def receipt_header(decision: Decision) -> bytes:
    return orjson.dumps(
        {
            "backend": decision.target.id,
            "prefill": decision.prefill.id if decision.prefill else None,
            "reason": decision.reason,
            "scores": decision.scores,
        }
    )
