"""The scraper against HTTP answers faked with respx (httpx is its client). Its health checks
report to an owner of backend health, faked here by one that records the reports."""

import httpx
import respx

from fleet.clock import FakeClock
from fleet.registry import FleetRegistry
from fleet.scrape import Scraper
from fleet.types import Backend, BackendSpec, EngineMetrics, MetricsSnapshot

METRICS = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 5\n'


class RecordedHealth:
    """A `HealthReports` that keeps each report as (backend id, detail; "" for a pass)."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, str]] = []

    def check_passed(self, backend: Backend) -> None:
        self.reports.append((backend.id, ""))

    def check_failed(self, backend: Backend, detail: str) -> None:
        self.reports.append((backend.id, detail))


def make() -> tuple[FleetRegistry, Scraper, FakeClock, httpx.AsyncClient, RecordedHealth]:
    clock = FakeClock()
    fleet = FleetRegistry(stale_after=1.0)
    fleet.add(BackendSpec(id="a", url="http://a.test"))
    client = httpx.AsyncClient()
    health = RecordedHealth()
    return fleet, Scraper(fleet, client, clock, health=health), clock, client, health


@respx.mock
async def test_health_models_and_metrics_make_a_backend_routable() -> None:
    fleet, scraper, clock, client, health = make()
    respx.get("http://a.test/health").respond(200)
    respx.get("http://a.test/v1/models").respond(json={"data": [{"id": "m"}]})
    respx.get("http://a.test/metrics").respond(text=METRICS)
    b = fleet.get("a")
    assert b is not None
    assert fleet.candidates("m", clock.now()) == []
    await scraper.check_health(b)
    assert health.reports == [("a", "")]
    await scraper.learn_models(b)
    await scraper.scrape_metrics(b)
    assert b.spec.models == ("m",)
    assert b.snapshot is not None and b.snapshot.metrics.running == 5
    assert fleet.candidates("m", clock.now()) == [b]
    assert fleet.candidates("other", clock.now()) == []
    await client.aclose()


def test_stale_backends_get_no_requests_while_others_are_fresh() -> None:
    clock = FakeClock()
    fleet = FleetRegistry(stale_after=1.0)
    a = fleet.add(BackendSpec(id="a", url="http://a.test", models=("m",)))
    b = fleet.add(BackendSpec(id="b", url="http://b.test", models=("m",)))
    a.snapshot = MetricsSnapshot(taken_at=clock.now(), metrics=EngineMetrics())
    clock.advance(0.8)
    b.snapshot = MetricsSnapshot(taken_at=clock.now(), metrics=EngineMetrics())
    clock.advance(0.5)  # a's scrape is now 1.3 s old, b's 0.5 s
    assert fleet.candidates("m", clock.now()) == [b]
    assert fleet.routable(clock.now()) == [b]
    clock.advance(5)  # every scrape stale at once: this process is lagging, not the fleet
    assert fleet.candidates("m", clock.now()) == [a, b]
    b.healthy = False
    assert fleet.candidates("m", clock.now()) == [a]


@respx.mock
async def test_each_health_check_is_reported_and_changes_no_health_itself() -> None:
    fleet, scraper, _, client, health = make()
    b = fleet.get("a")
    assert b is not None
    route = respx.get("http://a.test/health")
    for answer in (
        httpx.Response(503),
        httpx.ReadTimeout("slow"),
        httpx.Response(200),
        httpx.ConnectError("refused"),
    ):
        route.mock(side_effect=[answer])
        await scraper.check_health(b)
    assert health.reports == [
        ("a", "/health answered 503"),
        ("a", "/health failed: ReadTimeout: slow"),
        ("a", ""),
        ("a", "/health failed: ConnectError: refused"),
    ]
    assert b.healthy and b.last_error == ""  # the owner of backend health decides
    await client.aclose()


@respx.mock
async def test_scrape_errors_are_recorded_not_raised() -> None:
    fleet, scraper, _, client, _ = make()
    respx.get("http://a.test/metrics").respond(500)
    respx.get("http://a.test/v1/models").respond(text="not json")
    b = fleet.get("a")
    assert b is not None
    await scraper.scrape_metrics(b)
    assert b.snapshot is None and "/metrics failed" in b.last_error
    await scraper.learn_models(b)
    assert b.spec.models == () and "/v1/models failed" in b.last_error
    await client.aclose()


def test_candidates_and_routable_apply_one_rule() -> None:
    clock = FakeClock()
    fleet = FleetRegistry(stale_after=1.0)
    ids = ("ok", "unhealthy", "draining", "ejected", "unscraped")
    backends = {i: fleet.add(BackendSpec(id=i, url=f"http://{i}.test", models=("m",))) for i in ids}
    for b in backends.values():
        if b.id != "unscraped":
            b.snapshot = MetricsSnapshot(taken_at=clock.now(), metrics=EngineMetrics())
    backends["unhealthy"].healthy = False
    backends["draining"].draining = True
    backends["ejected"].ejected_until = clock.now() + 10
    now = clock.now()
    assert fleet.candidates("m", now) == fleet.routable(now) == [backends["ok"]]
    assert [b.id for b in backends.values() if b.routable(now, 1.0)] == ["ok"]


@respx.mock
async def test_lora_adapters_are_learned_from_their_parent_and_forgotten_with_the_backend() -> None:
    fleet, scraper, _, client, _ = make()
    fleet.add(BackendSpec(id="b", url="http://b.test"))
    models = respx.get("http://a.test/v1/models")
    models.respond(json={"data": [{"id": "m", "parent": None}, {"id": "sql", "parent": "m"}]})
    respx.get("http://b.test/v1/models").respond(json={"data": [{"id": "m"}, {"id": "sql"}]})
    a, b = fleet.get("a"), fleet.get("b")
    assert a is not None and b is not None
    await scraper.learn_models(a)
    await scraper.learn_models(b)
    assert a.spec.models == ("m", "sql") and a.adapters == frozenset({"sql"})
    assert b.adapters == frozenset()  # no parent given: a model of its own
    assert fleet.is_adapter("sql") and not fleet.is_adapter("m")
    models.respond(json={"data": [{"id": "m"}]})  # the adapter was unloaded
    await scraper.learn_models(a)
    assert not fleet.is_adapter("sql")
    models.respond(json={"data": [{"id": "m"}, {"id": "sql", "parent": "m"}]})
    await scraper.learn_models(a)
    assert fleet.is_adapter("sql")
    fleet.remove("a")
    assert not fleet.is_adapter("sql")
    await client.aclose()
