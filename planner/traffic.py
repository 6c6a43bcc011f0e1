"""What the SLA mode observes over one adjustment interval, from the engines' cumulative
counters as the proxy scrapes them: `observe_traffic(window) -> Traffic | None`.

Every counter is cumulative, so an interval's amount is a delta between the interval's first
and last reading of a backend. A backend's delta counts only when it has both ends (it was
there at the first and at the last reading it appears in, at two distinct times) and no counter
went down (a restarted engine starts again from 0: its delta would be wrong, so it is left out
for this interval). Over the decode side (roles `decode` and `both`, where requests finish once
each, as the client sees them), with T the time between the window's first and last pull:

    rate = sum(d finished) / T                           finished requests/s
    ISL  = sum(d prompt_len_sum) / sum(d prompt_len_count)
    OSL  = sum(d output_len_sum) / sum(d output_len_count)
    ITL  = sum(d itl_sum) / sum(d itl_count)
    in_flight = mean over the pulls of (running requests / decode-side backends)
    context   = ISL + OSL / 2         a request's context grows from ISL to ISL + OSL

TTFT (and the ISL it was observed at) comes from the prefill side when that side finished
requests (a disaggregated fleet: the prefill engine's TTFT is what the prefill profile
measures), else from the decode side (an aggregated fleet). A mean whose count did not move
is None.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Protocol

from fleet.types import Role


@dataclass(frozen=True, slots=True)
class RequestCounters:
    """One engine's cumulative request counters (fleet.types.EngineMetrics' names)."""

    requests_finished: float = 0.0
    prompt_len_sum: float = 0.0
    prompt_len_count: float = 0.0
    output_len_sum: float = 0.0
    output_len_count: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0

    def minus(self, earlier: RequestCounters) -> RequestCounters | None:
        """The deltas since `earlier`; None when any counter went down (an engine restart)."""
        deltas = {f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in _FIELDS}
        if any(d < 0 for d in deltas.values()):
            return None
        return RequestCounters(**deltas)

    def plus(self, other: RequestCounters) -> RequestCounters:
        return RequestCounters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in _FIELDS}
        )


_FIELDS = fields(RequestCounters)


@dataclass(frozen=True, slots=True)
class BackendReading:
    """One backend's counters at one pull."""

    id: str
    role: Role
    running: float  # requests running now (a gauge)
    counters: RequestCounters


@dataclass(frozen=True, slots=True)
class Traffic:
    """One interval's observations (see the module's formulas)."""

    seconds: float  # T
    rate: float  # finished requests/s
    isl: float | None
    osl: float | None
    ttft: float | None  # seconds
    ttft_isl: float | None  # the mean ISL of the requests the TTFT was observed on
    itl: float | None  # seconds
    in_flight: float | None  # running requests per decode-side engine
    context: float | None  # tokens


class Pull(Protocol):
    """What one metric pull holds for the traffic: its time and the backends' readings."""

    @property
    def at(self) -> float: ...

    @property
    def readings(self) -> tuple[BackendReading, ...]: ...


def observe_traffic(window: Sequence[Pull]) -> Traffic | None:
    """The interval's traffic from its pulls (oldest first); None when the pulls span no time
    or no decode-side backend has a usable delta."""
    pulls = [p for p in window if p.readings]
    if len(pulls) < 2 or pulls[-1].at <= pulls[0].at:
        return None
    seconds = pulls[-1].at - pulls[0].at
    decode = _side_delta(pulls, decode_side=True)
    if decode is None:
        return None
    prefill = _side_delta(pulls, decode_side=False)
    ttft_from = prefill if prefill is not None and prefill.ttft_count > 0 else decode
    isl = _ratio(decode.prompt_len_sum, decode.prompt_len_count)
    osl = _ratio(decode.output_len_sum, decode.output_len_count)
    return Traffic(
        seconds=seconds,
        rate=decode.requests_finished / seconds,
        isl=isl,
        osl=osl,
        ttft=_ratio(ttft_from.ttft_sum, ttft_from.ttft_count),
        ttft_isl=_ratio(ttft_from.prompt_len_sum, ttft_from.prompt_len_count),
        itl=_ratio(decode.itl_sum, decode.itl_count),
        in_flight=_mean_in_flight(pulls),
        context=isl + osl / 2 if isl is not None and osl is not None else None,
    )


def _on_decode_side(role: Role) -> bool:
    return role is not Role.PREFILL


def _side_delta(pulls: Sequence[Pull], *, decode_side: bool) -> RequestCounters | None:
    first: dict[str, BackendReading] = {}
    last: dict[str, BackendReading] = {}
    for p in pulls:
        for r in p.readings:
            if _on_decode_side(r.role) is decode_side:
                first.setdefault(r.id, r)
                last[r.id] = r
    total: RequestCounters | None = None
    for backend_id, start in first.items():
        end = last[backend_id]
        if end is start:
            continue  # read once: no delta
        delta = end.counters.minus(start.counters)
        if delta is not None:
            total = delta if total is None else total.plus(delta)
    return total


def _mean_in_flight(pulls: Iterable[Pull]) -> float | None:
    per_pull = [
        sum(r.running for r in side) / len(side)
        for p in pulls
        if (side := [r for r in p.readings if _on_decode_side(r.role)])
    ]
    return sum(per_pull) / len(per_pull) if per_pull else None


def _ratio(total: float, count: float) -> float | None:
    return total / count if count > 0 else None


@dataclass(frozen=True, slots=True)
class Forecast:
    """The predictors' values for the next interval (None: nothing to predict from yet)."""

    rate: float | None
    isl: float | None
    osl: float | None


@dataclass(frozen=True, slots=True)
class SlaInputs:
    """What an SLA decision read: the forecast, the interval's observations and the
    corrections taken from them (1: nothing observed, trust the profile)."""

    forecast: Forecast
    observed: Traffic | None
    ttft_correction: float = 1.0
    itl_correction: float = 1.0
