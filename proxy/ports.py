"""The proxy's services as the request and control layers see them: small protocols that the
composition root (`proxy.serving.wiring.ProxyCore`) satisfies, so that a request session or
an admin operation can be built and tested with fakes for exactly what it uses.

Read-only properties: a port's user reads the services, the composition root owns them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from fleet.clock import Clock
    from fleet.live import LiveTable
    from fleet.prompt_tokens import PromptTokens
    from fleet.registry import FleetRegistry
    from fleet.tokens import TokenCounter
    from policies.policy import Policy, RequestContext
    from proxy.asgi import Receive
    from proxy.backends.health import BackendHealth
    from proxy.backends.upstream import Upstream
    from proxy.metrics import RouterMetrics
    from proxy.settings import Settings
    from rescheduler.loop import ReschedulerLoop


class FinishedRequest(NamedTuple):
    """What the request log keeps of one request that was served by a session: plain values,
    read when the request ends, so the session's objects are freed at once."""

    model: str
    stream: bool
    backends: list[str]  # the backend of each leg that answered, in order
    attempts: int  # backends tried before the first byte
    moves: int
    ttft: float | None  # seconds from arrival to the first streamed byte relayed
    routed_prompt_tokens: int
    answer: bytes | None  # an answer relayed whole, for its `usage`
    completion_tokens: int | None  # from a tracked stream's token ids


class RateCharge(NamedTuple):
    """What a rate-limited request was charged: the `x-ratelimit-*` headers its answer
    carries, and the prompt estimate taken from its tenant's tokens (None: not limited)."""

    headers: list[tuple[bytes, bytes]]
    tokens: int | None


class FlowTicket(NamedTuple):
    """A request flow control let through: who asked, how urgently, how long it waited."""

    tenant: str
    priority: int
    waited: float  # seconds in the flow-control queue (0: dispatched at once)
    program: str | None
    key: int = 0  # which admission this is, unique in its process
    rate: RateCharge | None = None  # None: its tenant has no rate limits
    # Backends with no room when it was let through: routed elsewhere when another can take it.
    avoid: tuple[str, ...] = ()


class FlowControl(Protocol):
    """Flow control at the gateway (proxy/serving/flow_gate.py), when configured."""

    async def admit(self, ctx: RequestContext, receive: Receive) -> FlowTicket:
        """Return when the request may be routed: at once while its model's pool has room, else
        when dispatched from the queue. Raises ProxyError when refused (queue full, waited past
        its TTL) or when the client leaves while queued (499)."""

    def done(self, ticket: FlowTicket, finished: FinishedRequest | None) -> None:
        """The request ended: its room may go to a queued one, its usage charged to its tenant
        (`finished` is read only for a program's service or a tenant's token limit)."""


class RequestLog(Protocol):
    """Where the hot path reports each finished request."""

    def sampled(self) -> bool:
        """Whether the next finished request is to be recorded (asked first, so that an
        unsampled request builds nothing)."""

    def record(
        self,
        endpoint: str,
        request_id: str,
        status: int,
        arrived: float,
        finished: FinishedRequest | None,
        flow: FlowTicket | None = None,
    ) -> None:
        """`arrived`: perf_counter time; `finished`: None for a request refused before a
        session served it; `flow`: what flow control knew of it, when it is on."""


class FleetServices(Protocol):
    """What both the request and the control code read: settings, the clock, the fleet and
    its live requests, the policy, and the owner of backend health."""

    @property
    def settings(self) -> Settings: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def fleet(self) -> FleetRegistry: ...
    @property
    def live(self) -> LiveTable: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def health(self) -> BackendHealth: ...


class RequestServices(FleetServices, Protocol):
    """What one client request's code (`proxy.request`) may use of the proxy."""

    @property
    def metrics(self) -> RouterMetrics: ...
    @property
    def prompt_tokens(self) -> PromptTokens | None: ...
    @property
    def tokens(self) -> TokenCounter | None: ...
    @property
    def request_log(self) -> RequestLog | None: ...
    @property
    def grace_over(self) -> bool:
        """Whether a stop's grace period is over: connections closed now are the proxy's."""

    def upstream_pool(self) -> Upstream:
        """The forwarding client; exists once the proxy started."""


class ControlServices(FleetServices, Protocol):
    """What the control plane (`proxy.control`) may use of the proxy."""

    @property
    def rescheduler(self) -> ReschedulerLoop | None: ...
    @property
    def prom(self) -> CollectorRegistry: ...
