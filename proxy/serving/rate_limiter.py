"""Per-tenant rate limits at the gateway (flow control's `rate_limits`): the buckets of
flowcontrol/rate_limit.py kept in a RateTable (shared by every worker), the headers OpenAI
clients read on each answer, and OpenAI's 429 when a tenant is over."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter

from fleet.clock import Clock
from flowcontrol.config import RateLimitsConfig
from flowcontrol.rate_limit import Limits, Quota, Verdict, correct, duration, take
from flowcontrol.rate_table import RateTable
from proxy.errors import ProxyError
from proxy.ports import FinishedRequest, RateCharge
from proxy.stream.answer_usage import usage_counts

Headers = list[tuple[bytes, bytes]]


class RateLimiter:
    def __init__(
        self,
        config: RateLimitsConfig,
        table: RateTable,
        clock: Clock,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._default = config.default.limits()
        self._tenants = {name: limit.limits() for name, limit in config.tenants.items()}
        self._table = table
        self._clock = clock
        self._limited: Counter | None = None
        if registry is not None:
            self._limited = Counter(
                "fleet_proxy_rate_limited_requests",
                "Requests refused with 429 for a tenant's requests or tokens per minute",
                ["tenant", "limit"],
                registry=registry,
            )

    def limits(self, tenant: str) -> Limits:
        return self._tenants.get(tenant, self._default)

    def admit(self, tenant: str, prompt_tokens: int) -> RateCharge | None:
        """Take one request and the prompt estimate from `tenant`'s buckets: the charge (None
        when the tenant is not limited), or a 429 ProxyError when it is over a limit."""
        limits = self.limits(tenant)
        if not limits.any:
            return None
        now = self._clock.now()
        verdict = self._table.update(tenant, lambda b: take(b, limits, now, prompt_tokens))
        headers = quota_headers(verdict)
        if not verdict.allowed:
            if self._limited is not None:
                label = tenant if tenant in self._tenants else "other"
                self._limited.labels(label, verdict.exceeded).inc()
            raise refusal(tenant, verdict, prompt_tokens, headers)
        return RateCharge(headers, prompt_tokens if limits.tokens is not None else None)

    def settle(self, tenant: str, charge: RateCharge, finished: FinishedRequest | None) -> None:
        """The request ended: its tokens charged as its usage says (prompt and completion),
        where known; an answer with no usage keeps the estimate."""
        if charge.tokens is None:
            return
        used = usage(finished)
        if used is None:
            return
        self.refund(tenant, charge.tokens - used)

    def refund(self, tenant: str, tokens: int) -> None:
        """Give `tokens` back (a request the proxy refused after charging it)."""
        if tokens == 0:
            return
        limits = self.limits(tenant)
        now = self._clock.now()
        self._table.update(tenant, lambda b: (correct(b, limits, now, -tokens), None))


def usage(finished: FinishedRequest | None) -> int | None:
    """Prompt plus completion tokens of an ended request: from a whole answer's `usage`, else
    the routed prompt estimate plus the tokens a tracked stream counted."""
    if finished is None:
        return None
    if finished.answer is not None:
        counts = usage_counts(finished.answer)
        return sum(counts.values()) if counts else None
    if finished.completion_tokens is not None:
        return finished.routed_prompt_tokens + finished.completion_tokens
    return None


def quota_headers(verdict: Verdict) -> Headers:
    out: Headers = []
    for kind, quota in (("requests", verdict.requests), ("tokens", verdict.tokens)):
        if quota is not None:
            out.extend(_triple(kind, quota))
    return out


def _triple(kind: str, q: Quota) -> Headers:
    return [
        (f"x-ratelimit-limit-{kind}".encode(), str(q.limit).encode()),
        (f"x-ratelimit-remaining-{kind}".encode(), str(q.remaining).encode()),
        (f"x-ratelimit-reset-{kind}".encode(), duration(q.reset).encode()),
    ]


def refusal(tenant: str, verdict: Verdict, prompt_tokens: int, headers: Headers) -> ProxyError:
    """OpenAI's answer to a client over its rate: 429, `type` naming the bucket, `code`
    rate_limit_exceeded, and when to try again."""
    kind = verdict.exceeded
    quota = verdict.requests if kind == "requests" else verdict.tokens
    assert quota is not None
    unit = "RPM" if kind == "requests" else "TPM"
    asked = 1 if kind == "requests" else prompt_tokens
    wait = verdict.retry_after
    message = (
        f"Rate limit reached for tenant {tenant!r} on {kind} per min ({unit}): "
        f"Limit {quota.limit}, Remaining {quota.remaining}, Requested {asked}. "
        f"Please try again in {duration(wait)}."
    )
    retry = [
        (b"retry-after", str(max(1, math.ceil(wait))).encode()),
        (b"retry-after-ms", str(max(1, math.ceil(wait * 1000))).encode()),
    ]
    return ProxyError(
        429, message, type=kind, code="rate_limit_exceeded", headers=[*headers, *retry]
    )
