"""Small constructors for the rescheduler's views, so each test states only what matters."""

from __future__ import annotations

from typing import Any

from rescheduler.config import ReschedulerConfig
from rescheduler.view import ClusterView, InferType, InstanceView, RequestView

NOW = 1000.0


def req(
    key: str,
    *,
    arrived: float = 0.0,
    prompt: int = 100,
    generated: int = 0,
    running: bool = True,
    movable: bool = True,
) -> RequestView:
    return RequestView(
        key=key,
        request_id=f"rid-{key}",
        arrived_at=arrived,
        charged_prompt_tokens=prompt,
        generated_tokens=generated,
        running=running,
        movable=movable,
    )


def inst(id: str, infer_type: InferType = InferType.DECODE, **fields: Any) -> InstanceView:
    fields.setdefault("scraped_at", NOW)
    return InstanceView(id=id, infer_type=infer_type, **fields)


def reqs(prefix: str, n: int, **fields: Any) -> tuple[RequestView, ...]:
    """n requests keyed prefix-0.., arriving in that order."""
    return tuple(req(f"{prefix}-{k}", arrived=float(k), **fields) for k in range(n))


def view(*instances: InstanceView) -> ClusterView:
    return ClusterView(taken_at=NOW, instances=instances)


def cfg(*policies: str, **fields: Any) -> ReschedulerConfig:
    if policies:
        fields["policies"] = policies
    return ReschedulerConfig(**fields)
