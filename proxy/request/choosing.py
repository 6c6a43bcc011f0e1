"""Which backend a leg goes to: the fleet's candidates for the request's model now, and the
policy's pick among them; and the questions a planned move asks of those candidates."""

from __future__ import annotations

import contextlib
from collections.abc import Collection

from fleet.types import Backend
from policies.policy import Decision, NoCandidate, RequestContext
from proxy.errors import ProxyError, model_not_found
from proxy.ports import RequestServices
from proxy.stream.move_kinds import transfers_kv

# The reason of a decision the policy did not make (a planned move to a named backend).
CALLER_CHOSEN = "chosen by the caller"


class BackendChooser:
    """Reads the fleet and the policy through the proxy's services on every question: both
    change while the proxy runs."""

    __slots__ = ("_core",)

    def __init__(self, core: RequestServices) -> None:
        self._core = core

    def choose(
        self,
        ctx: RequestContext,
        exclude: Collection[str],
        *,
        first: bool,
        required: Backend | None = None,
        avoid: Collection[str] = (),
    ) -> Decision:
        """The policy's pick among routable backends serving the model, not in `exclude`.

        For a first leg, when every candidate was excluded (tried), a healthy one again: a lone
        backend that timed out once deserves a second chance. A continuation never goes back.
        `avoid`: backends to pass over when the policy can pick among the others (flow
        control saw no room on them); when it cannot (a prefill/decode policy left without a
        decode backend, say), they are candidates as any other.
        """
        core = self._core
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
                raise model_not_found(ctx.model)
            raise _unavailable(f"no healthy backend serves model `{ctx.model}` right now")
        if avoid:
            preferred = [b for b in candidates if b.id not in avoid]
            if preferred and len(preferred) < len(candidates):
                with contextlib.suppress(NoCandidate):
                    return core.policy.pick(ctx, preferred, now)
        try:
            return core.policy.pick(ctx, candidates, now)
        except NoCandidate as e:
            raise _unavailable(str(e)) from None

    def can_take(self, backend: Backend, model: str) -> bool:
        """Whether `backend` may take a new request for `model` now."""
        core = self._core
        return any(b is backend for b in core.fleet.candidates(model, core.clock.now()))

    def has_other(self, backend: Backend, model: str) -> bool:
        """Whether a backend other than `backend` may take a new request for `model` now."""
        core = self._core
        return any(b is not backend for b in core.fleet.candidates(model, core.clock.now()))

    def others_transfer_kv(self, backend: Backend, model: str) -> bool:
        """Whether a backend other than `backend` that may take `model` now transfers KV."""
        core = self._core
        return any(
            b is not backend and transfers_kv(b.spec.labels)
            for b in core.fleet.candidates(model, core.clock.now())
        )


def _unavailable(message: str) -> ProxyError:
    return ProxyError(
        503, message, type="service_unavailable", code=503, headers=[(b"retry-after", b"1")]
    )
