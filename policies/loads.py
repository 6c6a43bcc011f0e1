"""Load readings of one backend, as routing sees them: the larger of the proxy's own live
accounting and the last scrape, so a burst the scraper has not seen yet still counts, and so
does load other clients put on the engine.

Counts from the proxy's own accounting are totals over its worker processes: this worker's
`Load` fields plus `Load.peer_*` (the other workers', fleet/peer_load.py; 0 with one worker).
Policies read load through these functions, not `b.load` directly, so they see every worker.

Written with plain comparisons: these run once per candidate per decision, and
`max(float(a), b)` costs several times more than the comparison in CPython.
"""

from __future__ import annotations

from fleet.types import Backend


def in_flight(b: Backend) -> int:
    """Requests in flight on the backend through this proxy, all workers."""
    load = b.load
    return load.in_flight + load.peer_in_flight


def pending_prefill_tokens(b: Backend) -> int:
    """Prompt tokens dispatched to the backend and not yet past their first token, all workers."""
    load = b.load
    return load.pending_prefill_tokens + load.peer_pending_prefill_tokens


def running_decodes(b: Backend) -> int:
    """Requests on the backend past their first token, all workers."""
    load = b.load
    return load.running_decodes + load.peer_running_decodes


def batch_size(b: Backend) -> float:
    """Running + waiting requests: the larger of the proxy's accounting and the scrape."""
    load = b.load
    bs: float = load.in_flight + load.peer_in_flight
    snap = b.snapshot
    if snap is not None:
        m = snap.metrics
        scraped = m.running + m.waiting
        if scraped > bs:
            return scraped
    return bs


def queue_size(b: Backend) -> float:
    """Requests not producing tokens yet: waiting, or dispatched without a first token."""
    load = b.load
    own: float = (
        load.in_flight + load.peer_in_flight - load.running_decodes - load.peer_running_decodes
    )
    snap = b.snapshot
    if snap is not None and snap.metrics.waiting > own:
        return snap.metrics.waiting
    return own


def running_size(b: Backend) -> float:
    own: float = b.load.running_decodes + b.load.peer_running_decodes
    snap = b.snapshot
    if snap is not None and snap.metrics.running > own:
        return snap.metrics.running
    return own


def kv_usage(b: Backend) -> float:
    return 0.0 if b.snapshot is None else b.snapshot.metrics.kv_usage
