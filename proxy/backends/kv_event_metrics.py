"""Metrics of the KV-event subscribers and the precise index, read when Prometheus asks (the
event loop and routing pay nothing per event for them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleet.clock import Clock
from fleet.prompt_tokens import PromptTokens
from proxy.backends.kv_event_subscribers import KvEventSubscribers


class KvEventsCollector(Collector):
    def __init__(
        self,
        subscribers: KvEventSubscribers,
        clock: Clock,
        prompt_tokens: Callable[[], PromptTokens | None],
    ) -> None:
        self.subscribers = subscribers
        self.clock = clock
        self.prompt_tokens = prompt_tokens

    def collect(self) -> Iterator[Metric]:
        label = ["backend"]

        def counter(name: str, doc: str, labels: list[str] = label) -> CounterMetricFamily:
            return CounterMetricFamily(f"fleet_proxy_kv_{name}", doc, labels=labels)

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"fleet_proxy_kv_{name}", doc, labels=label)

        events = counter("events", "KV-cache events applied, live or replayed")
        batches = counter("event_batches", "KV-event batches applied, live or replayed")
        gaps = counter("event_gaps", "Holes in a backend's batch sequence seen live")
        replays = counter("event_replays", "Replays that filled a hole or a late start")
        duplicates = counter("event_duplicates", "Live batches a replay had delivered first")
        bad = counter("events_undecodable", "Messages or replayed batches that did not decode")
        resyncs = counter(
            "event_resyncs",
            "A backend's index started over: a hole no replay filled (gap), or its publisher "
            "restarted (restart)",
            ["backend", "reason"],
        )
        blocks = gauge("blocks_indexed", "Blocks the precise index holds for the backend")
        precise = gauge(
            "index_precise", "1 while the backend's precise index stands in routing for it"
        )
        index = self.subscribers.index
        now = self.clock.now()
        for stream in self.subscribers.streams():
            lv = [stream.backend_id]
            c = stream.counters
            events.add_metric(lv, c.events)
            batches.add_metric(lv, c.batches)
            gaps.add_metric(lv, c.gaps)
            replays.add_metric(lv, c.replays)
            duplicates.add_metric(lv, c.duplicates)
            bad.add_metric(lv, c.undecodable)
            for reason in ("gap", "restart"):
                resyncs.add_metric([*lv, reason], c.resyncs.get(reason, 0))
            blocks.add_metric(lv, index.blocks(stream.backend_id))
            precise.add_metric(lv, 1.0 if index.precise(stream.backend_id, now) else 0.0)
        yield from (events, batches, gaps, replays, duplicates, bad, resyncs, blocks, precise)
        ic = index.counters
        skipped = counter(
            "blocks_skipped",
            "Stored blocks the precise index left out: unknown parent (orphaned), not whole "
            "blocks of the engine's size (unaligned), another tier than the GPU's "
            "(other_medium), or past max_blocks_per_backend (overflowed)",
            ["reason"],
        )
        for reason, n in (
            ("orphaned", ic.orphaned),
            ("unaligned", ic.unaligned),
            ("other_medium", ic.other_medium),
            ("overflowed", ic.overflowed),
        ):
            skipped.add_metric([reason], n)
        yield skipped
        tokens = self.prompt_tokens()
        if tokens is not None:
            calls = counter(
                "prompt_tokenize",
                "Prompts tokenized for the precise index, by outcome: tokenized, cached (an "
                "earlier answer), failed (routed without token ids)",
                ["outcome"],
            )
            calls.add_metric(["tokenized"], tokens.tokenized)
            calls.add_metric(["cached"], tokens.cache_hits)
            calls.add_metric(["failed"], tokens.failures)
            yield calls
