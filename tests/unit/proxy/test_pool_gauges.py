"""The pool gauges of /metrics count the fleet's routable backends per model, read at scrape
time: what one pick was offered (a retry is offered only the backends not tried yet) does not
change them."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleet.clock import FakeClock
from fleet.types import EngineMetrics, MetricsSnapshot
from policies.policy import RequestContext
from proxy.serving.wiring import ProxyCore
from proxy.settings import load_settings

MODEL = "m"


def gauges(core: ProxyCore) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(core.prom).decode()):
        if fam.name.startswith("inference_pool_"):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def ctx() -> RequestContext:
    return RequestContext("r", "completions", MODEL, {}, {}, False, "hello", 1)


def scraped_core(clock: FakeClock, waiting: tuple[int, ...]) -> ProxyCore:
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(len(waiting))]
    core = ProxyCore(
        load_settings({"backends": [{"url": u, "models": [MODEL]} for u in urls]}), clock
    )
    for b, w in zip(core.fleet, waiting, strict=True):
        b.healthy = True
        b.snapshot = MetricsSnapshot(clock.now(), EngineMetrics(waiting=w))
    return core


def test_a_retry_offered_fewer_backends_does_not_change_the_pool_gauges() -> None:
    clock = FakeClock()
    core = scraped_core(clock, (4, 0))
    everyone = core.fleet.candidates(MODEL, clock.now())
    assert len(everyone) == 2
    core.policy.pick(ctx(), everyone, clock.now())
    before = gauges(core)
    core.policy.pick(ctx(), everyone[1:], clock.now())  # the retry: the first one was tried
    after = gauges(core)
    pool = (("name", MODEL),)
    assert after[("inference_pool_ready_pods", pool)] == 2
    assert after[("inference_pool_average_queue_size", pool)] == 2.0  # (4 + 0) / 2
    assert after == before


def test_pool_gauges_follow_the_fleet_without_any_pick() -> None:
    clock = FakeClock()
    core = scraped_core(clock, (1, 3, 5))
    pool = (("name", MODEL),)
    assert gauges(core)[("inference_pool_ready_pods", pool)] == 3
    first = next(iter(core.fleet))
    core.fleet.set_draining(first.id, True)
    got = gauges(core)
    assert got[("inference_pool_ready_pods", pool)] == 2
    assert got[("inference_pool_average_queue_size", pool)] == 4.0  # (3 + 5) / 2
    per_pod = {dict(k[1])["model_server_pod"] for k in got if k[0].endswith("per_pod_queue_size")}
    assert first.id not in per_pod
