"""How a planned move carries its KV to the target: the kind it takes (proxy/stream/move_kinds.py
weighs them) and, for a pre-copy, the staging of the KV in the target's prefix cache while the
source keeps decoding."""

from __future__ import annotations

from collections.abc import Callable

from fleet.types import Backend
from policies.policy import RequestContext
from proxy.errors import ProxyError
from proxy.request.choosing import BackendChooser
from proxy.request.kv_legs import KvLegs
from proxy.stream.continuation import continuation_body
from proxy.stream.move_kinds import MoveCosts, MoveKind, RequestedKind, choose_kind, transfers_kv
from proxy.stream.token_ledger import TokenLedger

CONTINUE_PATH = "/v1/completions"


def moves_kv(backend: Backend) -> bool:
    """Whether `backend` sends and receives KV over NIXL (its `kv_connector` label)."""
    return transfers_kv(backend.spec.labels)


def planned_kind(
    chooser: BackendChooser,
    ctx: RequestContext,
    ledger: TokenLedger | None,
    costs: MoveCosts,
    source: Backend,
    to: Backend | None,
    requested: RequestedKind,
) -> tuple[MoveKind, Backend | None]:
    """The kind of a planned move off `source`, and its target when a pre-copy needs one now."""
    if requested == "recompute" or not moves_kv(source):
        return "recompute", to
    both = moves_kv(to) if to is not None else chooser.others_transfer_kv(source, ctx.model)
    kind = choose_kind(_tokens_to_move(ctx, ledger), both, costs, requested)
    if kind == "precopy" and to is None:
        # Staging needs its target now: the policy's pick, then fixed for this move.
        try:
            decision = chooser.choose(ctx, {source.id}, first=False)
        except ProxyError:
            return "recompute", None
        if not moves_kv(decision.target):
            return "recompute", None
        to = decision.target
    return kind, to


def _tokens_to_move(ctx: RequestContext, ledger: TokenLedger | None) -> int:
    if ledger is None:
        return ctx.prompt_tokens
    prompt = ledger.prompt_ids()
    return (len(prompt) if prompt is not None else ctx.prompt_tokens) + len(ledger.generated)


async def precopy(
    kv_legs: KvLegs,
    ctx: RequestContext,
    ledger: TokenLedger,
    source: Backend,
    target: Backend,
    leg_headers: Callable[[], list[tuple[bytes, bytes]]],
) -> int:
    """Stage the KV of prompt + the tokens generated so far in `target`'s prefix cache while
    the source keeps decoding; the tokens staged, 0 when the staging failed."""
    prompt_ids = ledger.prompt_ids()
    if prompt_ids is None:
        return 0
    generated = list(ledger.generated)
    try:
        body = continuation_body(
            ctx.endpoint, ctx.body, prompt_ids, generated, max_model_len=source.max_model_len
        )
    except ValueError:
        return 0
    tokens = len(prompt_ids) + len(generated)
    # Both legs share one request id, as a P/D prefill and decode leg do.
    headers = leg_headers()
    kv = await kv_legs.kv_from(source, CONTINUE_PATH, headers, body, tokens, "precopy")
    if kv is None or not await kv_legs.pull_kv(target, CONTINUE_PATH, headers, body, kv, tokens):
        return 0
    return tokens
