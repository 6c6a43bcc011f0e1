"""Backends and request contexts for policy tests, built from plain numbers."""

from __future__ import annotations

from collections.abc import Mapping

from fleet.tokens import estimate_tokens
from fleet.types import Backend, BackendSpec, EngineMetrics, Load, MetricsSnapshot, Role
from policies.policy import RequestContext

MODEL = "m"


def backend(
    bid: str,
    *,
    in_flight: int = 0,
    pending: int = 0,
    decoding: int = 0,
    role: Role = Role.BOTH,
    labels: Mapping[str, str] | None = None,
    scraped: EngineMetrics | None = None,
) -> Backend:
    spec = BackendSpec(
        id=bid,
        url=f"http://127.0.0.1:{8000 + len(bid)}",
        role=role,
        labels=dict(labels or {}),
        models=(MODEL,),
    )
    b = Backend(spec=spec, load=Load(in_flight, pending, decoding))
    if scraped is not None:
        b.snapshot = MetricsSnapshot(taken_at=0.0, metrics=scraped)
    return b


def fleet(n: int, **kw: int) -> list[Backend]:
    return [backend(f"b{i}", **kw) for i in range(n)]  # type: ignore[arg-type]


def ctx(
    text: str = "",
    tokens: int | None = None,
    *,
    session: str | None = None,
    program: str | None = None,
    debug: bool = False,
) -> RequestContext:
    return RequestContext(
        request_id="r",
        endpoint="completions",
        model=MODEL,
        body={},
        headers={},
        stream=False,
        prompt_text=text,
        prompt_tokens=estimate_tokens(text) if tokens is None else tokens,
        session_id=session,
        program_id=program,
        debug=debug,
    )


def text_blocks(n: int, tag: str = "x", chars_per_block: int = 64) -> str:
    """A text of exactly `n` full blocks, distinct per `tag`."""
    unit = (tag * chars_per_block)[:chars_per_block]
    return "".join(f"{i:04d}{unit[4:]}" for i in range(n))
