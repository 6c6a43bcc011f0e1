"""The endpoint picker's decision for one request: which engines (primary, then fallbacks)
and, for a disaggregated request, which prefill engine; the body rewritten when a model alias
applies. The same routing as the proxy's own data plane: the fleet's candidates for the model
and the policy's pick among them. The caller owns the gRPC stream."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import orjson

from fleet.types import Backend
from policies.policy import NoCandidate, RequestContext
from proxy.errors import ProxyError, model_not_found
from proxy.gateway.shedding import Shedding
from proxy.ports import FleetServices
from proxy.request.context import ContextReader
from proxy.request.routes import HOT_ROUTES

if TYPE_CHECKING:
    from fleet.prompt_tokens import PromptTokens
    from fleet.tokens import TokenCounter


class PickerServices(FleetServices, Protocol):
    """What the picker reads of the proxy's core, beyond the fleet and the policy: the
    prompt's token ids (routing by the engines' KV-cache events) and an exact token count."""

    @property
    def prompt_tokens(self) -> PromptTokens | None: ...
    @property
    def tokens(self) -> TokenCounter | None: ...


@dataclass(frozen=True, slots=True)
class Pick:
    target: Backend
    fallbacks: tuple[Backend, ...]
    prefill: Backend | None  # the prefill engine of a disaggregated request
    endpoint: str  # "completions", "chat/completions", ... ("" for a request with no body)
    model: str
    charged_tokens: int  # prompt tokens the target is expected to compute
    body: bytes | None  # the body to send on, when it changed (a model alias)


def host_port(backend: Backend) -> str:
    """`ip:port` of a backend's base URL, as the gateway's destination header carries it."""
    rest = backend.url.split("://", 1)[-1]
    return rest.split("/", 1)[0]


class EndpointPicker:
    """Reads the fleet and the policy on every pick: both change while the picker runs."""

    __slots__ = ("_aliases", "_contexts", "_core", "_fallbacks", "_shedding")

    def __init__(self, core: PickerServices, fallbacks: int, shedding: Shedding) -> None:
        s = core.settings
        self._core = core
        self._aliases: Mapping[str, str] = dict(s.model_aliases)
        self._contexts = ContextReader(s, debug=False)
        self._fallbacks = fallbacks
        self._shedding = shedding

    async def pick(
        self,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        subset: Collection[str] | None,
        request_id: str,
    ) -> Pick:
        """Raises ProxyError with the status the gateway answers instead: 503 when no engine
        fits, 429 for a sheddable request when every engine is saturated, 404 for a model no
        engine serves, 400 for a body the engines would refuse."""
        core = self._core
        route = HOT_ROUTES.get(path.split("?", 1)[0])
        if route is None or not body:
            # No model to route by (GET /v1/models, /health): any engine that takes requests.
            pool = _in_subset(core.fleet.routable(core.clock.now()), subset)
            if not pool:
                raise _unavailable("no engine takes requests right now")
            ordered = sorted(pool, key=_busy)
            fallbacks = tuple(ordered[1 : 1 + self._fallbacks])
            return Pick(ordered[0], fallbacks, None, "", "", 0, None)
        endpoint, generates = route
        ctx = self._contexts.read(endpoint, generates, body, headers, request_id)
        new_body: bytes | None = None
        served = self._aliases.get(ctx.model)
        if served is not None:
            ctx.model = served
            ctx.body["model"] = served
            new_body = orjson.dumps(ctx.body)
        if generates:
            await self._count(ctx)
        now = core.clock.now()  # after the counting's awaits
        candidates = _in_subset(core.fleet.candidates(ctx.model, now), subset)
        if not candidates:
            fleet = core.fleet
            if subset is None and fleet.routable(now) and not fleet.knows_model(ctx.model):
                raise model_not_found(ctx.model)
            raise _unavailable(f"no healthy engine serves model `{ctx.model}` right now")
        shedding = self._shedding
        if shedding.sheddable(headers) and shedding.saturated(candidates):
            raise ProxyError(
                429,
                "every engine is saturated and this request's objective is sheddable",
                type="rate_limit_error",
                code=429,
            )
        try:
            decision = core.policy.pick(ctx, candidates, now)
        except NoCandidate as e:
            raise _unavailable(str(e)) from None
        target = decision.target
        # Fallbacks, for the gateway's retries when the primary fails: the least busy others.
        others = sorted((b for b in candidates if b is not target), key=_busy)
        charged = decision.prefill_tokens
        return Pick(
            target,
            tuple(others[: self._fallbacks]),
            decision.prefill,
            endpoint,
            ctx.model,
            ctx.prompt_tokens if charged is None else charged,
            new_body,
        )

    async def _count(self, ctx: RequestContext) -> None:
        """The prompt's engine token ids when routing follows the engines' KV-cache events,
        or its exact count when a tokenizer is configured; as the proxy's data plane does."""
        core = self._core
        prompt_tokens = core.prompt_tokens
        # A LoRA adapter's blocks are hashed with the adapter: its events cannot place it.
        if prompt_tokens is not None and not core.fleet.is_adapter(ctx.model):
            ids = await prompt_tokens.token_ids(ctx.endpoint, ctx.model, ctx.body)
            if ids is not None:
                ctx.prompt_token_ids = ids
                ctx.prompt_tokens = len(ids)
                return
        tokens = core.tokens
        if tokens is not None and tokens.mode != "estimate" and not ctx.prompt_is_token_ids:
            ctx.prompt_tokens = await tokens.count(
                ctx.prompt_text, ctx.model, ctx.endpoint, ctx.body
            )


def _busy(backend: Backend) -> int:
    load = backend.load
    return load.in_flight + load.peer_in_flight


def _in_subset(backends: list[Backend], subset: Collection[str] | None) -> list[Backend]:
    """The backends the gateway allows for this request (its subset hint), all without one."""
    if subset is None:
        return backends
    return [b for b in backends if host_port(b) in subset]


def _unavailable(message: str) -> ProxyError:
    return ProxyError(503, message, type="service_unavailable", code=503)
