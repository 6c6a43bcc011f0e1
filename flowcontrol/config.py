"""The `flow_control` settings block (YAML, like `routing`): absent, flow control is off."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flowcontrol.rate_limit import Limits
from flowcontrol.saturation import SaturationThresholds


class SaturationConfig(BaseModel):
    """When a model's pool counts as saturated: llm-d's saturation detector's defaults."""

    model_config = ConfigDict(extra="forbid")

    # An endpoint with this many requests waiting (engine queue, plus what the proxy sent that
    # no scrape shows yet) has no room.
    queue_depth_threshold: int = Field(5, ge=1)
    # An endpoint whose KV cache is this full (0..1) has no room.
    kv_cache_util_threshold: float = Field(0.8, gt=0, le=1, allow_inf_nan=False)
    # How late an endpoint's scrape may be past `scrape_interval` before its numbers are not
    # trusted (and it counts as having no room).
    metrics_staleness_threshold: float = Field(0.2, ge=0, allow_inf_nan=False)
    # The engines' `--max-num-seqs`. Set, an endpoint has room only while fewer requests run
    # on it than this (the queue depth above no longer applies): nothing waits in the engines,
    # so whatever flow control dispatches next is the next to run.
    max_num_seqs: int | None = Field(None, ge=1)

    def thresholds(self, scrape_interval: float) -> SaturationThresholds:
        return SaturationThresholds(
            self.queue_depth_threshold,
            self.kv_cache_util_threshold,
            self.metrics_staleness_threshold + scrape_interval,
            self.max_num_seqs,
        )


class BandConfig(BaseModel):
    """Limits of one priority band, overriding the defaults."""

    model_config = ConfigDict(extra="forbid")

    queue_ttl: float | None = Field(None, gt=0, allow_inf_nan=False)
    capacity: int | None = Field(None, ge=0)
    tenant_capacity: int | None = Field(None, ge=0)


class RateLimit(BaseModel):
    """A tenant's allowance per minute; an absent one is not limited."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(None, ge=1)
    # Prompt plus completion tokens, from the answers' usage (the prompt estimate is charged
    # when the request passes, corrected when its usage is known).
    tokens_per_minute: int | None = Field(None, ge=1)

    def limits(self) -> Limits:
        return Limits(self.requests_per_minute, self.tokens_per_minute)


class RateLimitsConfig(BaseModel):
    """Per-tenant rate limits: `default` for every tenant, `tenants` replacing it for some."""

    model_config = ConfigDict(extra="forbid")

    default: RateLimit = Field(default_factory=lambda: RateLimit.model_validate({}))
    # Tenant -> its own allowance, in place of the default (a limit it leaves out is none).
    tenants: dict[str, RateLimit] = Field(default_factory=dict)

    def of(self, tenant: str) -> Limits:
        own = self.tenants.get(tenant)
        return (own if own is not None else self.default).limits()

    @property
    def any(self) -> bool:
        return self.default.limits().any or any(t.limits().any for t in self.tenants.values())


class FlowControlConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Who is asking: the tenant comes from the client's API key when `api_keys` names one,
    # else from this header, else "default".
    fairness_header: str = "x-gateway-fairness-id"
    # An objective's name (priority from `objectives`) or a number (the priority itself).
    objective_header: str = "x-gateway-inference-objective"
    priority_header: str = "x-gateway-priority"
    # Objective name -> priority. Higher goes first; below 0 is sheddable (429 when shed).
    objectives: dict[str, int] = Field(default_factory=dict)
    # A tenant's priority when its request names none (else 0).
    tenant_priorities: dict[str, int] = Field(default_factory=dict)
    # Between tenants of a band: `round_robin` (a request each in turn) or `token_weighted`
    # (equal shares of prompt tokens).
    fairness: Literal["round_robin", "token_weighted"] = "round_robin"
    # With `--workers N` (and no `fair_share_preemption`): tenants are compared by what the
    # whole proxy served them (requests, or prompt tokens with `token_weighted`), each
    # dispatch weighing exp(-age / fairness_memory) as it ages (seconds).
    fairness_memory: float = Field(10.0, gt=0, allow_inf_nan=False)
    # Inside a tenant: `fcfs`, or `las` (least attained service per `x-program-id`).
    ordering: Literal["fcfs", "las"] = "fcfs"
    # With `las`: a request waiting longer than this (seconds) goes before the rest of its
    # tenant's, oldest first.
    starvation_threshold: float = Field(5.0, gt=0, allow_inf_nan=False)
    # Defaults of every band: seconds a request may wait, requests a band holds, and requests
    # one tenant may hold in a band.
    queue_ttl: float = Field(30.0, gt=0, allow_inf_nan=False)
    band_capacity: int = Field(1000, ge=0)
    tenant_capacity: int = Field(200, ge=0)
    # Per priority, limits other than the defaults.
    bands: dict[int, BandConfig] = Field(default_factory=dict)
    saturation: SaturationConfig = Field(
        default_factory=lambda: SaturationConfig.model_validate({})
    )
    # While requests wait, how often the pool is checked again even when nothing finished
    # (scrapes change it too).
    recheck_interval: float = Field(0.05, gt=0, le=5, allow_inf_nan=False)
    # Suspend a running sheddable stream (movable_requests) while a request of a higher band
    # waits on its saturated pool: it is cut after the tokens its client has, queued again in
    # its band, and continued token-exact when dispatched.
    preemption: bool = False
    # Fairness by what runs, not only by what waits: inside a band, the room goes first to a
    # waiting tenant running fewer requests than the one fairness picked; and while the pool
    # is saturated, a waiting tenant running at least two fewer than the band's busiest takes
    # a seat from it (that tenant's latest movable stream is suspended, queued again and
    # continued token-exact, as with `preemption`). Best with `saturation.max_num_seqs`, so
    # the freed seat is not taken by a request already waiting in the engine.
    fair_share_preemption: bool = False
    # With `fair_share_preemption` and `saturation.max_num_seqs`: the pool's last free seats
    # kept for a tenant that runs nothing in the band (one of the pool's top band waiting, or
    # arriving), so its request starts at once instead of waiting for a suspension. The
    # tenants already running requests fill the others only.
    fair_share_reserved_seats: int = Field(0, ge=0)
    # What a refused client is told to wait (seconds) before it tries again.
    retry_after: int = Field(1, ge=0)
    # Requests and tokens per minute per tenant, checked before a request queues.
    rate_limits: RateLimitsConfig | None = None

    @model_validator(mode="after")
    def _reserve_needs_seats(self) -> FlowControlConfig:
        if self.fair_share_reserved_seats and not (
            self.fair_share_preemption and self.saturation.max_num_seqs
        ):
            raise ValueError(
                "fair_share_reserved_seats needs fair_share_preemption: true and "
                "saturation.max_num_seqs (the seats it keeps are the engines')"
            )
        return self

    @field_validator("fairness_header", "objective_header", "priority_header")
    @classmethod
    def _lower_case(cls, v: str) -> str:
        name = v.strip().lower()
        if not name or any(not ("\x21" <= c <= "\x7e") or c == ":" for c in name):
            raise ValueError(f"{v!r} is not an HTTP header name")
        return name

    def band(self, priority: int) -> tuple[float, int, int]:
        """(queue_ttl, capacity, tenant_capacity) of the band of `priority`."""
        b = self.bands.get(priority)
        if b is None:
            return self.queue_ttl, self.band_capacity, self.tenant_capacity
        return (
            self.queue_ttl if b.queue_ttl is None else b.queue_ttl,
            self.band_capacity if b.capacity is None else b.capacity,
            self.tenant_capacity if b.tenant_capacity is None else b.tenant_capacity,
        )
