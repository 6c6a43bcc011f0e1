"""The SLA arithmetic: replicas per role for the next interval from a predicted load and the
engines' profiles, as the newer SLA-based planners compute them; and the load predictors.

Inputs for the next interval: request rate r (requests/s), mean input length ISL and output
length OSL (tokens), predicted by a `Predictor` each.

Prefill. A prefill engine runs one long prompt at a time (no in-flight batching, as the
profiling assumes), so one request occupies it for its corrected TTFT:

    s = TTFT_profile(ISL) * c_ttft          c_ttft = observed TTFT / TTFT_profile(observed ISL)
    throughput per engine = ISL / s         tokens/s
    prefill = ceil(r * ISL / (ISL / s)) = ceil(r * s)

The TTFT target is met only if s <= target: adding engines shortens the queue, not a prompt's
own prefill, so a miss is reported (`meets_target`), not papered over with replicas. Queueing
headroom is not modelled: a fleet run at full prefill utilisation queues.

Decode. Each of n in-flight requests emits one token per ITL, so an engine at n in flight
gives n / ITL(n, L) tokens/s, at the mean context L = ISL + OSL / 2 (a request's context grows
from ISL to ISL + OSL while it decodes). The observed ITL runs c_itl = observed ITL /
ITL_profile(observed n, observed L) times the profile, so the profile must meet the tightened
target ITL_target / c_itl:

    n* = the n in 1..max_in_flight(L) with ITL(n, L) <= ITL_target / c_itl and the most
         tokens/s n / ITL(n, L) (the largest such n when ITL grows sub-linearly, as it does)
    decode = ceil(r * OSL / (n* / ITL(n*, L))) = ceil(r * OSL * ITL(n*, L) / n*)

max_in_flight(L) is what the engine's KV cache holds at context L. When even n = 1 misses
the target, n* = 1 and the miss is reported.

Counts are rounded up after forgiving a relative 1e-9, so that float noise in an exact
quotient (5.0000000001) does not cost a replica. Replica bounds and the GPU budget are the
caller's (planner.config), as in the load-based rules.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

_SLACK = 1e-9


class PrefillProfile(Protocol):
    def ttft(self, isl: float) -> float:
        """Seconds to first token of one request of `isl` tokens alone on one engine."""
        ...


class DecodeProfile(Protocol):
    def itl(self, in_flight: int, context: float) -> float:
        """Seconds between tokens with `in_flight` requests of `context` tokens each."""
        ...

    def max_in_flight(self, context: float) -> int:
        """The most requests of `context` tokens the engine's KV cache holds."""
        ...


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through `points` (sorted by x), extended along the end segments
    (a longer prompt than profiled takes longer, not as long as the longest profiled)."""
    if not points:
        raise ValueError("no profiled points")
    if len(points) == 1:
        return points[0][1]
    i = 1
    while i < len(points) - 1 and x > points[i][0]:
        i += 1
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class PrefillCurve:
    """Profiled TTFT (seconds) at input lengths: ((isl, ttft), ...) sorted by isl."""

    points: tuple[tuple[float, float], ...]

    def ttft(self, isl: float) -> float:
        return interpolate(self.points, isl)


@dataclass(frozen=True, slots=True)
class DecodeGrid:
    """Profiled ITL (seconds) over in-flight requests, per context length:
    ((context, ((in_flight, itl), ...)), ...) sorted by context, each curve by in_flight.
    Between profiled contexts ITL is linear in the context; `kv_tokens` is the engine's KV
    capacity in tokens, which bounds the in-flight count besides the largest one profiled."""

    curves: tuple[tuple[float, tuple[tuple[float, float], ...]], ...]
    kv_tokens: int | None = None

    def itl(self, in_flight: int, context: float) -> float:
        at_context = tuple((ctx, interpolate(curve, in_flight)) for ctx, curve in self.curves)
        return interpolate(at_context, context)

    def max_in_flight(self, context: float) -> int:
        """What the KV cache holds at `context`, and never past the largest in-flight count
        profiled: ITL beyond it would be a straight-line guess, not a measurement."""
        profiled = int(max(n for _, curve in self.curves for n, _ in curve))
        if self.kv_tokens is not None:
            return max(1, min(profiled, int(self.kv_tokens // max(context, 1.0))))
        return profiled


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    replicas: int
    seconds_per_request: float  # s: corrected TTFT of one request on one engine
    engine_throughput: float  # tokens/s one engine prefills
    meets_target: bool


@dataclass(frozen=True, slots=True)
class DecodePlan:
    replicas: int
    in_flight: int  # n*: requests per engine
    itl: float  # profiled ITL at n* (before correction)
    engine_throughput: float  # tokens/s one engine decodes
    meets_target: bool


def ceil_count(x: float) -> int:
    return max(0, math.ceil(x - _SLACK * max(1.0, abs(x))))


def correction(observed: float | None, profiled: float) -> float:
    """observed / profiled; 1 when nothing was observed (trust the profile)."""
    if observed is None or observed <= 0 or profiled <= 0:
        return 1.0
    return observed / profiled


def prefill_replicas(
    rate: float,
    isl: float,
    profile: PrefillProfile,
    ttft_target: float,
    ttft_correction: float = 1.0,
) -> PrefillPlan:
    s = profile.ttft(isl) * ttft_correction
    return PrefillPlan(
        replicas=ceil_count(rate * s),
        seconds_per_request=s,
        engine_throughput=isl / s,
        meets_target=s <= ttft_target,
    )


def decode_replicas(
    rate: float,
    isl: float,
    osl: float,
    profile: DecodeProfile,
    itl_target: float,
    itl_correction: float = 1.0,
) -> DecodePlan:
    context = isl + osl / 2
    target = itl_target / itl_correction
    best_n, best_itl, best_thpt = 1, profile.itl(1, context), 0.0
    for n in range(1, profile.max_in_flight(context) + 1):
        itl = profile.itl(n, context)
        if itl <= target and n / itl >= best_thpt:
            best_n, best_itl, best_thpt = n, itl, n / itl
    met = best_thpt > 0
    throughput = best_n / best_itl
    return DecodePlan(
        replicas=ceil_count(rate * osl / throughput),
        in_flight=best_n,
        itl=best_itl,
        engine_throughput=throughput,
        meets_target=met,
    )


class Predictor(Protocol):
    """A one-step-ahead forecast of a load series (request rate, ISL or OSL)."""

    def observe(self, x: float) -> None: ...

    def predict(self) -> float | None:
        """The next value; None before any observation."""
        ...


class ConstantPredictor:
    """The next interval looks like the last one."""

    def __init__(self) -> None:
        self._last: float | None = None

    def observe(self, x: float) -> None:
        self._last = x

    def predict(self) -> float | None:
        return self._last


class MovingAveragePredictor:
    """The mean of the last `window` observations."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"moving-average window must be >= 1, not {window}")
        self._values: deque[float] = deque(maxlen=window)

    def observe(self, x: float) -> None:
        self._values.append(x)

    def predict(self) -> float | None:
        return sum(self._values) / len(self._values) if self._values else None
