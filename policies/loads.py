"""Load readings of one backend, as routing sees them: the larger of the proxy's own live
accounting and the last scrape, so a burst the scraper has not seen yet still counts, and so
does load other clients put on the engine.

Written with plain comparisons: these run once per candidate per decision, and
`max(float(a), b)` costs several times more than the comparison in CPython.
"""

from __future__ import annotations

from fleet.types import Backend


def batch_size(b: Backend) -> float:
    """Running + waiting requests (`Backend.batch_size`)."""
    return b.batch_size


def queue_size(b: Backend) -> float:
    """Requests not producing tokens yet: waiting, or dispatched without a first token."""
    own: float = b.load.in_flight - b.load.running_decodes
    snap = b.snapshot
    if snap is not None and snap.metrics.waiting > own:
        return snap.metrics.waiting
    return own


def running_size(b: Backend) -> float:
    own: float = b.load.running_decodes
    snap = b.snapshot
    if snap is not None and snap.metrics.running > own:
        return snap.metrics.running
    return own


def kv_usage(b: Backend) -> float:
    return 0.0 if b.snapshot is None else b.snapshot.metrics.kv_usage
