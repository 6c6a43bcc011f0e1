"""The proxy's state as the decision core sees it: Backends and live requests -> ClusterView.

The same function builds the view of `fleet-proxy serve`'s own rescheduler and the one the
admin API hands a standalone rescheduler (GET /admin/rescheduler/view), so both decide on the
same data. It only reads: no I/O, and the clock reading is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable

from fleet.clock import Clock
from fleet.live import LiveEntry
from fleet.types import Backend, MetricsSnapshot, Role
from rescheduler.view import ClusterView, InferType, InstanceView, RequestView

INFER_TYPES: dict[Role, InferType] = {
    Role.PREFILL: InferType.PREFILL,
    Role.DECODE: InferType.DECODE,
    Role.BOTH: InferType.NEUTRAL,
}

PREFILL_RESERVED_LABEL = "prefill_reserved"


def recent_itl(previous: MetricsSnapshot | None, current: MetricsSnapshot | None) -> float | None:
    """Mean inter-token latency between two scrapes; None when no token came in between (or
    the engine restarted and its counters fell)."""
    if previous is None or current is None:
        return None
    count = current.metrics.itl_count - previous.metrics.itl_count
    if count <= 0:
        return None
    total = current.metrics.itl_sum - previous.metrics.itl_sum
    return total / count if total >= 0 else None


def request_view(entry: LiveEntry) -> RequestView:
    return RequestView(
        key=entry.upstream_request_id,
        request_id=entry.request_id,
        arrived_at=entry.arrived_at,
        charged_prompt_tokens=entry.charged_prompt_tokens,
        generated_tokens=entry.tokens_generated,
        running=entry.running,
        movable=entry.movable_reason(planned=True) == "",
    )


def instance_view(backend: Backend, requests: tuple[RequestView, ...], now: float) -> InstanceView:
    spec = backend.spec
    snap = backend.snapshot
    load = backend.load
    m = snap.metrics if snap is not None else None
    return InstanceView(
        id=backend.id,
        infer_type=INFER_TYPES[spec.role],
        node=spec.node,
        unit=spec.unit,
        schedulable=backend.healthy and not backend.draining and now >= backend.ejected_until,
        prefill_reserved=spec.labels.get(PREFILL_RESERVED_LABEL, "").lower() == "true",
        scraped_at=snap.taken_at if snap is not None else None,
        kv_usage=m.kv_usage if m is not None else 0.0,
        num_running=m.running if m is not None else 0.0,
        num_waiting=m.waiting if m is not None else 0.0,
        num_gpu_blocks=m.num_gpu_blocks if m is not None else None,
        block_size=m.block_size if m is not None else None,
        recent_itl_s=recent_itl(backend.previous_snapshot, snap),
        # Every worker's accounting: the engine's queue is the fleet's, not this process's.
        pending_prefill_tokens=load.pending_prefill_tokens + load.peer_pending_prefill_tokens,
        requests=requests,
    )


def cluster_view(backends: Iterable[Backend], live: Iterable[LiveEntry], now: float) -> ClusterView:
    """`live`: this process's requests (with `--workers N`, only those it relays)."""
    by_backend: dict[str, list[RequestView]] = {}
    for entry in live:
        backend_id = entry.backend_id
        if backend_id:  # between legs a request is on no backend: nothing to move
            by_backend.setdefault(backend_id, []).append(request_view(entry))
    return ClusterView(
        taken_at=now,
        instances=tuple(instance_view(b, tuple(by_backend.get(b.id, ())), now) for b in backends),
    )


class LocalViewSource:
    """The view of the proxy this runs in: its fleet registry and its own live requests."""

    def __init__(
        self, backends: Iterable[Backend], live: Iterable[LiveEntry], clock: Clock
    ) -> None:
        self.backends = backends
        self.live = live
        self.clock = clock

    async def view(self) -> ClusterView:
        return cluster_view(self.backends, self.live, self.clock.now())
