"""Scheduler, pool and prefix-index metrics, named after llm-d EPP's.

Everything registers on the registry the proxy passes to `bind_metrics`; nothing touches the
global default registry. Pool gauges and the prefix index size are computed when /metrics is
scraped (a custom collector), so they cost the hot path nothing: the pools are the fleet's
backends that may take a request for each model then, as the proxy's `PoolSource` gives them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleet.lean_histogram import LeanChild, LeanHistogram
from fleet.prefix import PrefixIndex
from fleet.types import Backend
from policies.loads import kv_usage, queue_size, running_size

# Routing decisions take microseconds; the default buckets start at 5 ms.
_LATENCY_BUCKETS = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.0002,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.05,
)
_RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_BYTES_BUCKETS = (0, 64, 256, 1024, 4096, 16384, 65536, 262144)

# () -> {model: the backends that may take a request for it now}, called at scrape time.
PoolSource = Callable[[], Mapping[str, Sequence[Backend]]]


class _PoolCollector(Collector):
    def __init__(
        self,
        pools: PoolSource,
        index: Callable[[], PrefixIndex | None],
    ) -> None:
        self._pools = pools
        self._index = index

    def collect(self) -> Iterator[Metric]:
        ready = GaugeMetricFamily(
            "inference_pool_ready_pods", "Number of ready pods in the pool", labels=["name"]
        )
        kv = GaugeMetricFamily(
            "inference_pool_average_kv_cache_utilization",
            "Average KV cache utilization across the pool",
            labels=["name"],
        )
        queue = GaugeMetricFamily(
            "inference_pool_average_queue_size",
            "Average number of pending requests across the pool",
            labels=["name"],
        )
        per_pod = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size",
            "Queue size for each individual pod",
            labels=["model_server_pod", "name"],
        )
        running = GaugeMetricFamily(
            "inference_pool_average_running_requests",
            "Average number of running requests across the pool",
            labels=["name"],
        )
        for name, backends in list(self._pools().items()):  # a copy: scrapes may run off-loop
            n = len(backends)
            ready.add_metric([name], n)
            if n == 0:
                continue
            queues = [queue_size(b) for b in backends]
            kv.add_metric([name], sum(kv_usage(b) for b in backends) / n)
            queue.add_metric([name], sum(queues) / n)
            running.add_metric([name], sum(running_size(b) for b in backends) / n)
            for b, q in zip(backends, queues, strict=True):
                per_pod.add_metric([b.id, name], q)
        size = GaugeMetricFamily(
            "inference_extension_prefix_indexer_size", "Size of the prefix indexer (blocks)"
        )
        index = self._index()
        size.add_metric([], 0 if index is None else index.size())
        yield from (ready, kv, queue, per_pod, running, size)


class SchedulerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        pools: PoolSource,
        index: Callable[[], PrefixIndex | None],
    ) -> None:
        self.attempts = Counter(
            "inference_extension_scheduler_attempts",
            "Number of scheduling attempts and their outcomes",
            ["status", "target_model_name", "pod_name", "namespace", "port"],
            registry=registry,
        )
        self.e2e = LeanHistogram(
            "inference_extension_scheduler_e2e_duration_seconds",
            "End-to-end scheduling latency",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.plugin = LeanHistogram(
            "inference_extension_plugin_duration_seconds",
            "Processing latency for each plugin",
            ["extension_point", "plugin_type", "plugin_name"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.hit_ratio = LeanHistogram(
            "inference_extension_prefix_indexer_hit_ratio",
            "Hit ratio for prefix matches (of the chosen endpoint)",
            buckets=_RATIO_BUCKETS,
            registry=registry,
        )
        self.hit_bytes = LeanHistogram(
            "inference_extension_prefix_indexer_hit_bytes",
            "Bytes matched in prefix cache lookup (of the chosen endpoint)",
            buckets=_BYTES_BUCKETS,
            registry=registry,
        )
        registry.register(_PoolCollector(pools, index))
        self._plugin_children: dict[tuple[str, str, str], LeanChild] = {}
        self._attempt_children: dict[tuple[str, str, str], Counter] = {}

    def observe_plugin(self, point: str, plugin_type: str, name: str, seconds: float) -> None:
        key = (point, plugin_type, name)
        child = self._plugin_children.get(key)
        if child is None:
            child = self._plugin_children[key] = self.plugin.labels(*key)
        child.observe(seconds)

    def attempt(self, status: str, model: str, target: Backend | None) -> None:
        key = (status, model, "" if target is None else target.id)
        child = self._attempt_children.get(key)
        if child is None:
            port: int | None = None if target is None else urlsplit(target.url).port
            child = self.attempts.labels(status, model, key[2], "", "" if port is None else port)
            self._attempt_children[key] = child
        child.inc()
