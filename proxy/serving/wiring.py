"""Everything one proxy instance owns, built by `create_app` and started in its lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)

from fleet.clock import Clock, SystemClock
from fleet.discovery import StaticSource, reconcile
from fleet.live import LiveTable
from fleet.prompt_tokens import (
    HfTokenizer,
    PromptTokenizer,
    PromptTokens,
    RemoteTokenizer,
)
from fleet.registry import FleetRegistry
from fleet.scrape import MetricsShare, Scraper
from fleet.tokens import TokenCounter
from fleet.types import Backend
from policies.policy import Policy
from policies.registry import build_policy, build_routing
from policies.scheduler import Scheduler
from proxy.backends.health import BackendHealth
from proxy.backends.metrics_pages import PooledMetricsPages
from proxy.backends.upstream import Upstream, UpstreamPool, split_url
from proxy.control.request_log import JsonRequestLog
from proxy.metrics import BackendStateCollector, RouterMetrics
from proxy.settings import Settings
from rescheduler.decide import check_config
from rescheduler.executor import BoundedExecutor, LocalMover
from rescheduler.loop import ReschedulerLoop
from rescheduler.metrics import ReschedulerMetrics
from rescheduler.observe import LocalViewSource

if TYPE_CHECKING:
    from proxy.backends.kv_event_subscribers import KvEventSubscribers

log = logging.getLogger("fleet_proxy")


def make_policy(settings: Settings) -> Scheduler:
    if settings.routing is not None:
        return build_routing(settings.routing)
    return build_policy(settings.policy)


def make_prompt_tokens(
    settings: Settings, core: ProxyCore, client: httpx.AsyncClient
) -> PromptTokens:
    """The prompt tokenizer the precise prefix index needs (fleet/prompt_tokens.py)."""
    tokenizer: PromptTokenizer
    if settings.prompt_tokenizer == "hf":
        assert settings.tokenizer_path is not None  # checked with the settings
        tokenizer = HfTokenizer(settings.tokenizer_path)
    else:
        tokenizer = RemoteTokenizer(client, core.backend_urls)
    return PromptTokens(tokenizer, settings.prompt_token_cache_tokens)


def build_rescheduler(core: ProxyCore) -> ReschedulerLoop:
    """The colocated rescheduler: this process's view and its own live requests. With
    `--workers N` every worker runs one over its own requests (docs/rescheduler.md)."""
    s = core.settings
    config = s.rescheduler_config(s.workers)
    check_config(config)  # a ValueError stops start-up, naming the known names
    executor = BoundedExecutor(
        LocalMover(core.live, core.fleet),
        ReschedulerMetrics(core.prom),
        max_concurrent=s.rescheduling_max_concurrent_migrations,
        timeout=s.rescheduling_migration_timeout,
    )
    return ReschedulerLoop(
        LocalViewSource(core.fleet, core.live, core.clock),
        executor,
        config,
        executor.metrics,
        interval_s=s.rescheduling_interval_ms / 1000.0,
        history=s.rescheduling_history,
        clock=core.clock,
    )


def backend_authorization(settings: Settings) -> str | None:
    """The Authorization value every backend call carries (`backend_api_key`), if any."""
    key = settings.backend_api_key
    return None if key is None else f"Bearer {key.get_secret_value()}"


class ProxyCore:
    def __init__(
        self, settings: Settings, clock: Clock | None = None, upstream: Upstream | None = None
    ) -> None:
        """`upstream`: the forwarding client start() uses, closed by stop() (None: an
        `UpstreamPool` built from the settings)."""
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.fleet = FleetRegistry(stale_after=settings.stale_after)
        static = StaticSource(settings.backend_specs())
        for spec in reconcile(static.name, (), static.desired).add:
            self.fleet.add(spec)
        scheduler = make_policy(settings)
        self.policy: Policy = scheduler
        # The engines' own KV-cache events, followed only when the policy routes by them.
        self.precise_index = scheduler.services.precise_index
        self.kv_events: KvEventSubscribers | None = None
        if self.precise_index is not None:
            # Here, not at the top: ZeroMQ is loaded only by a proxy that follows the events.
            from proxy.backends.kv_event_subscribers import KvEventSubscribers

            self.kv_events = KvEventSubscribers(
                self.fleet,
                self.precise_index,
                self.clock,
                topic=settings.kv_events_topic,
                replay_timeout_s=settings.kv_events_replay_timeout,
            )
        self.prompt_tokens: PromptTokens | None = None  # built in start(), with the index
        self.live = LiveTable()
        self.prom = CollectorRegistry(auto_describe=True)
        self.metrics = RouterMetrics(self.prom, self.fleet.knows_model)
        self.fleet.on_removed(self.metrics.forget_backend)
        self.fleet.on_removed(self._forget_backend)
        self.prom.register(BackendStateCollector(self.fleet, self.clock))
        if self.kv_events is not None:
            from proxy.backends.kv_event_metrics import KvEventsCollector

            self.prom.register(
                KvEventsCollector(self.kv_events, self.clock, lambda: self.prompt_tokens)
            )
        # The process's own health (CPU, memory, open files, GC), as any Python exporter has
        # it: read at scrape time, nothing per request.
        ProcessCollector(registry=self.prom)
        PlatformCollector(registry=self.prom)
        GCCollector(registry=self.prom)
        self.health = BackendHealth(settings, self.fleet, self.live, self.metrics, self.clock)
        self.policy.bind_metrics(self.prom, self.routable_pools)
        self.fleet.on_removed(self.policy.on_backend_removed)
        self.rescheduler = build_rescheduler(self) if settings.enable_rescheduling else None
        # Set by a worker process before start(): scrapes shared with the other workers.
        self.metrics_share: MetricsShare | None = None
        self.request_log: JsonRequestLog | None = None
        if settings.request_log == "json":
            self.request_log = JsonRequestLog(
                settings.request_log_file, settings.request_log_sample_rate, self.prom
            )
        self._log_task: asyncio.Task[None] | None = None
        self.tokens: TokenCounter | None = None  # built in start(): remote mode needs a client
        self._given_upstream = upstream
        self.upstream: Upstream | None = None  # the forwarding client, from start() on
        self.page_pool: UpstreamPool | None = None  # the scrapes' client, from start() on
        self.control_client: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        # Set when a stop's grace period is over and the server closes the connections left:
        # their requests end as closed by the proxy (503), not as left by their clients.
        self.grace_over = False

    def end_grace(self) -> None:
        self.grace_over = True

    async def start(self) -> None:
        s = self.settings
        if self.request_log is not None:
            self.request_log.open()  # first: an unwritable log file stops start-up
            self._log_task = asyncio.create_task(self.request_log.run(), name="request-log")
        # Forwarding uses its own lean client (proxy/backends/upstream.py), never httpx: per request
        # it costs a fraction of any general-purpose client (docs/performance.md).
        # The backends' key goes on every call to them: forwarded requests, prefill and KV
        # legs and moves (the forwarding pool), /metrics scrapes (their own pool), health
        # checks, /v1/models, /tokenize (httpx).
        auth = backend_authorization(s)
        keyed = [(b"authorization", auth.encode("ascii"))] if auth else []
        upstream = self._given_upstream
        if upstream is None:
            upstream = UpstreamPool(
                connect_timeout=s.connect_timeout,
                read_timeout=s.read_timeout,
                max_idle_per_origin=s.max_idle_connections_per_backend,
                fixed_headers=keyed,
            )
        self.upstream = upstream
        # /metrics, read several times a second per backend, over a pool of the same kind
        # (a fifth of httpx's CPU per read) but its own: a forwarded request never rides a
        # connection a scrape left idle, where the pool would send it again on a fresh one if
        # the backend dropped it unanswered (its keep-alive race rule), and a request that
        # crashes engines would reach each twice.
        self.page_pool = UpstreamPool(
            connect_timeout=s.connect_timeout,
            read_timeout=s.scrape_timeout,
            max_idle_per_origin=1,
            fixed_headers=keyed,
        )
        self.control_client = httpx.AsyncClient(
            timeout=s.scrape_timeout,
            limits=httpx.Limits(max_connections=256),
            headers={"authorization": auth} if auth else None,
        )
        self.tokens = TokenCounter(
            s.token_counter,
            chars_per_token=s.chars_per_token,
            tokenizer_path=s.tokenizer_path,
            remote=RemoteTokenizer(self.control_client, self.backend_urls),
        )
        if self.kv_events is not None:
            self.prompt_tokens = make_prompt_tokens(s, self, self.control_client)
            self._tasks.append(asyncio.create_task(self.kv_events.run(), name="kv-events"))
        scraper = Scraper(
            self.fleet,
            self.control_client,
            self.clock,
            interval=s.scrape_interval,
            health_interval=s.health_interval,
            models_interval=s.models_interval,
            timeout=s.scrape_timeout,
            health=self.health,
            pages=PooledMetricsPages(self.page_pool, s.scrape_timeout),
            health_path=s.health_check_path,
            share=self.metrics_share,
        )
        self._tasks.append(asyncio.create_task(scraper.run(), name="scraper"))
        self._tasks.append(asyncio.create_task(self.health.run(), name="ejection"))
        if self.rescheduler is not None:
            self._tasks.append(asyncio.create_task(self.rescheduler.run(), name="rescheduler"))

    def _forget_backend(self, backend_id: str) -> None:
        origins = {split_url(b.url)[0] for b in self.fleet}
        if self.upstream is not None:
            self.upstream.retain_origins(origins)
        if self.page_pool is not None:
            self.page_pool.retain_origins(origins)

    def upstream_pool(self) -> Upstream:
        """The forwarding client; exists from start() on."""
        pool = self.upstream
        if pool is None:
            raise RuntimeError("the proxy is not started")
        return pool

    def routable_pools(self) -> dict[str, list[Backend]]:
        """Per model a backend names, the backends that may take a request for it now: what
        routing is offered before any is tried (the pool gauges, read at scrape time)."""
        now = self.clock.now()
        models = dict.fromkeys(m for b in self.fleet for m in b.spec.models)
        return {m: self.fleet.candidates(m, now) for m in models}

    def backend_urls(self, model: str) -> list[str]:
        """Base URLs of the backends that may take a request for `model` now."""
        return [b.url for b in self.fleet.candidates(model, self.clock.now())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.upstream is not None:
            await self.upstream.close()
        if self.page_pool is not None:
            await self.page_pool.close()
        if self.control_client is not None:
            await self.control_client.aclose()
        if self.request_log is not None:
            # Last: every request has finished by now, and its line goes out.
            self.request_log.stop()
            if self._log_task is not None:
                await self._log_task
                self._log_task = None
            self.request_log.close()
