"""The boards: what one worker posts, the others read once, in its backend's slot and
generation only; metrics too large for a cell send the readers back to scraping, and health
verdicts reach the readers' own health owners. Two `Scraper`s over one pair of boards in this
process stand for two workers."""

from collections.abc import Iterator

import httpx
import pytest
import respx

from fleet.clock import FakeClock
from fleet.metrics_board import (
    BoardLayout,
    BoardSegment,
    MetricsBoard,
    decode_metrics,
    encode_metrics,
)
from fleet.peer_load import SlotTable
from fleet.registry import FleetRegistry
from fleet.scrape import Scraper
from fleet.types import Backend, BackendSpec, EngineMetrics, MetricsSnapshot
from proxy.control.shared_scrapes import SharedScrapes

METRICS = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 5\n'


class RecordedHealth:
    """A `HealthReports` that keeps each verdict ("" for a pass)."""

    def __init__(self) -> None:
        self.reports: list[str] = []

    def check_passed(self, backend: Backend) -> None:
        self.reports.append("")

    def check_failed(self, backend: Backend, detail: str) -> None:
        self.reports.append(detail)


@pytest.fixture
def segment() -> Iterator[BoardSegment]:
    seg = BoardSegment(BoardLayout(slots=4, payload=1024))
    yield seg
    seg.close()


@pytest.fixture
def verdicts() -> Iterator[BoardSegment]:
    seg = BoardSegment(BoardLayout(slots=4, payload=64))
    yield seg
    seg.close()


def test_metrics_survive_the_trip_through_json_tuples_included() -> None:
    m = EngineMetrics(
        running=3.0,
        kv_usage=0.5,
        lora_running=("a", "b"),
        max_lora=2,
        enable_prefix_caching=True,
        models=("m",),
    )
    assert decode_metrics(encode_metrics(m)) == m


def test_a_post_is_read_once_and_only_in_its_generation(segment: BoardSegment) -> None:
    writer, reader = MetricsBoard.attach(segment.name), MetricsBoard.attach(segment.name)
    assert reader.read(1, 1, after=0) is None  # nothing posted yet
    assert writer.post(1, 1, 12.5, b"news")
    posted = reader.read(1, 1, after=0)
    assert posted is not None and posted.taken_at == 12.5
    assert posted.data == b"news"
    assert reader.read(1, 1, after=posted.seq) is None  # already taken
    assert reader.read(1, 7, after=0) is None  # another backend's, in a reused slot
    assert reader.read(0, 1, after=0) is None  # another slot
    writer.close()
    reader.close()


def test_metrics_too_large_for_a_cell_are_marked_not_torn(segment: BoardSegment) -> None:
    board = MetricsBoard.attach(segment.name)
    assert not board.post(2, 1, 1.0, b"x" * 1025)
    posted = board.read(2, 1, after=0)
    assert posted is not None and posted.data is None
    board.close()


Worker = tuple[FleetRegistry, Scraper, SharedScrapes, RecordedHealth]


def two_workers(
    segment: BoardSegment, verdicts: BoardSegment
) -> tuple[list[Worker], httpx.AsyncClient]:
    client = httpx.AsyncClient()
    workers = []
    for scraper in (True, False):
        fleet = FleetRegistry(stale_after=1.0)
        fleet.add(BackendSpec(id="a", url="http://a.test"))
        slots = SlotTable(segment.layout.slots)
        slots.assign("a", 1)
        boards = MetricsBoard.attach(segment.name), MetricsBoard.attach(verdicts.name)
        share = SharedScrapes(*boards, slots, scraper=scraper)
        health = RecordedHealth()
        polls = Scraper(fleet, client, FakeClock(), health=health, share=share)
        workers.append((fleet, polls, share, health))
    return workers, client


@respx.mock
async def test_one_worker_scrapes_and_the_other_takes_its_snapshot(
    segment: BoardSegment, verdicts: BoardSegment
) -> None:
    route = respx.get("http://a.test/metrics").respond(text=METRICS)
    workers, client = two_workers(segment, verdicts)
    (lead_fleet, lead, lead_share, _), (follow_fleet, follow, follow_share, _) = workers
    lead_backend, follow_backend = lead_fleet.get("a"), follow_fleet.get("a")
    assert lead_backend is not None and follow_backend is not None

    await follow.refresh_metrics(follow_backend)  # nothing posted yet: no scrape of its own
    assert route.call_count == 0 and follow_backend.snapshot is None
    await lead.refresh_metrics(lead_backend)
    assert route.call_count == 1
    await follow.refresh_metrics(follow_backend)
    assert route.call_count == 1
    assert follow_backend.snapshot == lead_backend.snapshot
    assert follow_backend.snapshot is not None and follow_backend.snapshot.metrics.running == 5

    # A snapshot already taken is not taken again: the previous one stays the one before it.
    await follow.refresh_metrics(follow_backend)
    assert follow_backend.previous_snapshot is None
    await client.aclose()
    lead_share.close()
    follow_share.close()


@respx.mock
async def test_a_backend_whose_metrics_do_not_fit_is_scraped_by_every_worker(
    segment: BoardSegment, verdicts: BoardSegment
) -> None:
    route = respx.get("http://a.test/metrics").respond(text=METRICS)
    workers, client = two_workers(segment, verdicts)
    (_, _, lead_share, _), (follow_fleet, follow, follow_share, _) = workers
    backend = follow_fleet.get("a")
    assert backend is not None
    huge = EngineMetrics(lora_running=tuple(f"adapter-{i}" for i in range(200)))
    lead_share.posted(backend, MetricsSnapshot(taken_at=1.0, metrics=huge))
    await follow.refresh_metrics(backend)
    assert route.call_count == 1  # its own scrape
    assert backend.snapshot is not None and backend.snapshot.metrics.running == 5
    await follow.refresh_metrics(backend)
    assert route.call_count == 2  # and again, until the scraper's fit once more
    lead_share.posted(backend, MetricsSnapshot(taken_at=2.0, metrics=EngineMetrics(running=1)))
    await follow.refresh_metrics(backend)
    assert route.call_count == 2
    assert backend.snapshot.metrics.running == 1
    await client.aclose()
    lead_share.close()
    follow_share.close()


@respx.mock
async def test_the_other_worker_takes_each_health_verdict_once(
    segment: BoardSegment, verdicts: BoardSegment
) -> None:
    route = respx.get("http://a.test/health").respond(503)
    workers, client = two_workers(segment, verdicts)
    (lead_fleet, lead, lead_share, lead_health), (_, _, follow_share, follow_health) = workers
    backend = lead_fleet.get("a")
    assert backend is not None
    assert not follow_share.checks(backend) and lead_share.checks(backend)
    assert follow_share.verdicts(backend) == []  # none yet

    await lead.check_health(backend)
    assert lead_health.reports == ["/health answered 503"]
    assert follow_share.verdicts(backend) == ["/health answered 503"]
    assert follow_share.verdicts(backend) == []  # taken

    # Three checks between two reads: the latest verdict, for each of them.
    route.respond(200)
    for _ in range(3):
        await lead.check_health(backend)
    assert follow_share.verdicts(backend) == ["", "", ""]
    # A failure's detail longer than a cell is cut, not refused.
    lead_share.checked(backend, "x" * 100, 1.0)
    assert follow_share.verdicts(backend) == ["x" * 64]
    assert follow_health.reports == []  # verdicts() only reads; the poll loop reports them
    await client.aclose()
    lead_share.close()
    follow_share.close()
