"""Per-tenant rate limits: requests per minute and tokens per minute, as token buckets.

Each limited tenant has two buckets holding at most a minute's allowance, refilled
continuously (a limit of 60 per minute gives one back every second). A request takes one
request and its prompt estimate of tokens; it is refused while either bucket holds less than
that. When the answer's usage is known the token bucket is corrected by the difference
(usage above the estimate leaves the bucket in debt, which delays the tenant's next
requests). Pure: state in, state out, the time passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

MINUTE = 60.0


@dataclass(frozen=True, slots=True)
class Limits:
    """Per minute; None: not limited."""

    requests: int | None = None
    tokens: int | None = None

    @property
    def any(self) -> bool:
        return self.requests is not None or self.tokens is not None


class Buckets(NamedTuple):
    """What a tenant has left, as of `at`."""

    requests: float
    tokens: float
    at: float


class Quota(NamedTuple):
    """One bucket as the client is told it: the limit, what is left, seconds until full."""

    limit: int
    remaining: int
    reset: float


class Verdict(NamedTuple):
    allowed: bool
    requests: Quota | None  # None: requests are not limited
    tokens: Quota | None
    # When refused: which bucket ("requests" or "tokens") and seconds until it holds enough.
    exceeded: str = ""
    retry_after: float = 0.0


def full(limits: Limits, now: float) -> Buckets:
    return Buckets(float(limits.requests or 0), float(limits.tokens or 0), now)


def refill(b: Buckets | None, limits: Limits, now: float) -> Buckets:
    """`b` brought up to `now` (a tenant never seen, or idle a minute, is full)."""
    if b is None:
        return full(limits, now)
    elapsed = max(0.0, now - b.at)
    return Buckets(
        _refilled(b.requests, limits.requests, elapsed),
        _refilled(b.tokens, limits.tokens, elapsed),
        max(now, b.at),
    )


def take(b: Buckets | None, limits: Limits, now: float, tokens: int) -> tuple[Buckets, Verdict]:
    """A request of `tokens` (prompt estimate) asks to pass: the buckets after, and the verdict.
    A refused request takes nothing. A prompt larger than the whole token limit passes when
    the bucket is full (it would never pass otherwise) and leaves it in debt."""
    b = refill(b, limits, now)
    need_r = 1.0 if limits.requests is not None else 0.0
    need_t = 0.0
    if limits.tokens is not None:
        need_t = float(min(tokens, limits.tokens))
    short_r = _wait(b.requests, need_r, limits.requests)
    short_t = _wait(b.tokens, need_t, limits.tokens)
    if short_r > 0.0 or short_t > 0.0:
        exceeded = "requests" if short_r >= short_t else "tokens"
        return b, Verdict(
            False, _quota(b.requests, limits.requests), _quota(b.tokens, limits.tokens),
            exceeded, max(short_r, short_t),
        )  # fmt: skip
    after = Buckets(
        b.requests - need_r,
        b.tokens - (float(tokens) if limits.tokens is not None else 0.0),
        b.at,
    )
    return after, Verdict(
        True, _quota(after.requests, limits.requests), _quota(after.tokens, limits.tokens)
    )


def correct(b: Buckets | None, limits: Limits, now: float, tokens: int) -> Buckets:
    """Charge `tokens` more (less when negative: the estimate was too high, or nothing was
    generated), never above a full bucket."""
    b = refill(b, limits, now)
    if limits.tokens is None:
        return b
    return b._replace(tokens=min(float(limits.tokens), b.tokens - tokens))


def idle(b: Buckets, limits: Limits, now: float) -> bool:
    """Whether `b` is full again: the same as a tenant never seen, so it may be forgotten."""
    r = refill(b, limits, now)
    return (limits.requests is None or r.requests >= limits.requests) and (
        limits.tokens is None or r.tokens >= limits.tokens
    )


def _refilled(level: float, limit: int | None, elapsed: float) -> float:
    if limit is None:
        return 0.0
    return min(float(limit), level + elapsed * limit / MINUTE)


def _wait(level: float, need: float, limit: int | None) -> float:
    """Seconds until `level` holds `need` (0: it does now)."""
    if limit is None or level >= need:
        return 0.0
    if limit == 0:
        return math.inf
    return (need - level) * MINUTE / limit


def _quota(level: float, limit: int | None) -> Quota | None:
    if limit is None:
        return None
    reset = 0.0 if limit == 0 else max(0.0, (limit - level) * MINUTE / limit)
    return Quota(limit, max(0, math.floor(level + 1e-9)), reset)


def duration(seconds: float) -> str:
    """OpenAI's reset format, Go's duration: `20ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`."""
    if seconds <= 0.0:
        return "0s"
    if seconds < 1.0:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    if seconds < MINUTE:
        return f"{round(seconds, 3):g}s"
    whole = math.ceil(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m}m{s}s" if h else f"{m}m{s}s"
