"""Whether a model's pool has room: llm-d's saturation detector, over what the proxy already
scrapes. An endpoint has room when its scrape is fresh, fewer than `queue_depth` requests wait
on it and its KV cache is below `kv_cache_util`; the pool is saturated when none has room.

The engine's waiting count lags the proxy by up to a scrape, and the proxy knows what changed
since: while the scrape showed a queue, each request the proxy has sent there since joined it
and each of its requests that ended there freed a seat the queue's head took, so the queue now
is `waiting + in_flight - in_flight_at_scrape` (room shows the moment a request ends, not a
scrape later: the pool stays busy). With no queue at the scrape, requests the proxy has sent
beyond what the engine reports running count as waiting, so a burst dispatched between two
scrapes cannot overfill an endpoint the scrape still shows empty.

With the engines' sequence slots configured (`max_num_seqs`), an endpoint has room only while
a slot is free: the proxy's requests on it, plus any other client's the scrape showed, are
fewer than the slots. Nothing then waits in an engine's queue, so a request the proxy
dispatches takes the next free slot rather than queueing behind ones dispatched earlier.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SaturationThresholds:
    queue_depth: int = 5
    kv_cache_util: float = 0.8
    # Seconds since a scrape past which its numbers are not trusted.
    metrics_staleness: float = 0.2
    # Each engine's sequence slots (its --max-num-seqs), when known: then an endpoint has room
    # only while one is free, and no request waits in an engine's queue.
    seats: int | None = None


@dataclass(frozen=True, slots=True)
class EndpointSignals:
    """One endpoint's numbers: its engine's latest scrape, and the proxy's requests on it."""

    waiting: float
    running: float
    kv_usage: float  # 0..1
    scrape_age: float  # seconds
    in_flight: int  # this proxy's requests on the endpoint
    in_flight_at_scrape: int | None = None  # the same when the scrape was taken in (None: unknown)


def endpoint_load(s: EndpointSignals, t: SaturationThresholds) -> float:
    """How full the endpoint is against the thresholds: 1.0 or more has no room."""
    if s.scrape_age > t.metrics_staleness:
        return math.inf
    if s.waiting > 0 and s.in_flight_at_scrape is not None:
        queued = max(0.0, s.waiting + s.in_flight - s.in_flight_at_scrape)
    else:
        queued = s.waiting + max(0.0, s.in_flight - s.running - s.waiting)
    kv = s.kv_usage / t.kv_cache_util
    seats = t.seats
    if seats is None:
        return max(queued / t.queue_depth, kv)
    if s.waiting > 0 and queued > 0:
        return math.inf  # a queue the engine showed is still there
    # Its requests and those others sent it (beyond this proxy's, as the scrape showed).
    others = 0.0
    if s.in_flight_at_scrape is not None:
        others = max(0.0, s.running + s.waiting - s.in_flight_at_scrape)
    return max((s.in_flight + others) / seats, kv)


def free_seats(load: float, t: SaturationThresholds) -> int:
    """With the engines' seats known, how many an endpoint at `load` (`endpoint_load`) has
    free; 0 without seats."""
    if t.seats is None or not load < 1.0:
        return 0
    return math.floor(t.seats * (1.0 - load) + 1e-9)


def pool_saturation(signals: Iterable[EndpointSignals], t: SaturationThresholds) -> float:
    """The least full endpoint's load: the pool is saturated at 1.0 or more (and with no
    endpoint at all)."""
    return min((endpoint_load(s, t) for s in signals), default=math.inf)


def saturated(signals: Iterable[EndpointSignals], t: SaturationThresholds) -> bool:
    return pool_saturation(signals, t) >= 1.0
