"""The scraper against HTTP answers faked with respx (httpx is its client)."""

import httpx
import respx

from fleet.clock import FakeClock
from fleet.registry import FleetRegistry
from fleet.scrape import Scraper
from fleet.types import BackendSpec

METRICS = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 5\n'


def make() -> tuple[FleetRegistry, Scraper, FakeClock, httpx.AsyncClient]:
    clock = FakeClock()
    fleet = FleetRegistry(stale_after=1.0)
    fleet.add(BackendSpec(id="a", url="http://a.test"))
    client = httpx.AsyncClient()
    return fleet, Scraper(fleet, client, clock), clock, client


@respx.mock
async def test_health_models_and_metrics_make_a_backend_routable() -> None:
    fleet, scraper, clock, client = make()
    respx.get("http://a.test/health").respond(200)
    respx.get("http://a.test/v1/models").respond(json={"data": [{"id": "m"}]})
    respx.get("http://a.test/metrics").respond(text=METRICS)
    b = fleet.get("a")
    assert b is not None
    assert fleet.candidates("m", clock.now()) == []
    await scraper.check_health(b)
    await scraper.learn_models(b)
    await scraper.scrape_metrics(b)
    assert b.spec.models == ("m",)
    assert b.snapshot is not None and b.snapshot.metrics.running == 5
    assert fleet.candidates("m", clock.now()) == [b]
    assert fleet.candidates("other", clock.now()) == []
    clock.advance(1.5)  # no scrape since: stale
    assert fleet.candidates("m", clock.now()) == []
    await client.aclose()


@respx.mock
async def test_failed_health_and_scrape_errors_are_recorded_not_raised() -> None:
    fleet, scraper, _, client = make()
    respx.get("http://a.test/health").mock(side_effect=httpx.ConnectError("refused"))
    respx.get("http://a.test/metrics").respond(500)
    respx.get("http://a.test/v1/models").respond(text="not json")
    b = fleet.get("a")
    assert b is not None
    await scraper.check_health(b)
    assert not b.healthy and "ConnectError" in b.last_error
    await scraper.scrape_metrics(b)
    assert b.snapshot is None and "/metrics failed" in b.last_error
    await scraper.learn_models(b)
    assert b.spec.models == () and "/v1/models failed" in b.last_error
    respx.get("http://a.test/health").respond(200)
    await scraper.check_health(b)
    assert b.healthy
    await client.aclose()
