"""One worker polls every backend's /metrics and health path, the others read its results
(`--workers N`).

The first worker (index 0) scrapes and checks, and posts each backend's parsed metrics and
each health verdict to the shared boards (fleet/metrics_board.py); every other worker takes
them from there at its own scrape interval, as if it had polled itself, one interval late at
most: a verdict goes to its own health owner (which takes the backend out or brings it back,
and frees its own requests), a snapshot becomes its own. /v1/models stays with every worker
(once per `models_interval`). A backend without a shared slot is polled by every worker as
before, and so are the metrics of one whose metrics do not fit a cell.
"""

from __future__ import annotations

from fleet.metrics_board import MetricsBoard, decode_metrics, encode_metrics
from fleet.peer_load import SlotTable
from fleet.types import Backend, MetricsSnapshot


class SharedScrapes:
    """This worker's side of the boards: `MetricsShare` (fleet/scrape.py)."""

    def __init__(
        self, metrics: MetricsBoard, health: MetricsBoard, slots: SlotTable, *, scraper: bool
    ) -> None:
        self.metrics = metrics
        self.health = health
        self.slots = slots  # PeerSync's, kept current by the change log
        self.scraper = scraper
        # slot -> seq of the cell last taken, on each board.
        self._seen_metrics: dict[int, int] = {}
        self._seen_health: dict[int, int] = {}
        # (slot, generation) of the backends whose metrics the scraper could not post.
        self._too_large: set[tuple[int, int]] = set()

    def scrapes(self, backend: Backend) -> bool:
        if self.scraper:
            return True
        entry = self.slots.get(backend.id)
        return entry is None or entry in self._too_large

    def checks(self, backend: Backend) -> bool:
        return self.scraper or self.slots.get(backend.id) is None

    def posted(self, backend: Backend, snapshot: MetricsSnapshot) -> None:
        entry = self.slots.get(backend.id)
        if self.scraper and entry is not None:
            data = encode_metrics(snapshot.metrics)
            self.metrics.post(entry[0], entry[1], snapshot.taken_at, data)

    def checked(self, backend: Backend, failure: str, at: float) -> None:
        entry = self.slots.get(backend.id)
        if self.scraper and entry is not None:
            room = self.health.layout.payload
            data = failure.encode()[:room].decode(errors="ignore").encode()
            self.health.post(entry[0], entry[1], at, data)

    def newer(self, backend: Backend) -> MetricsSnapshot | None:
        """The scraping worker's snapshot of `backend`, when newer than the last one taken."""
        entry = self.slots.get(backend.id)
        if self.scraper or entry is None:
            return None
        slot, generation = entry
        posted = self.metrics.read(slot, generation, self._seen_metrics.get(slot, 0))
        if posted is None:
            return None
        self._seen_metrics[slot] = posted.seq
        if posted.data is None:
            self._too_large.add(entry)
            return None
        self._too_large.discard(entry)
        return MetricsSnapshot(taken_at=posted.taken_at, metrics=decode_metrics(posted.data))

    def verdicts(self, backend: Backend) -> list[str]:
        """The scraping worker's health verdicts on `backend` since the last ones taken, as
        failure details ("" for a pass): the latest, once for every check it stands for."""
        entry = self.slots.get(backend.id)
        if self.scraper or entry is None:
            return []
        slot, generation = entry
        seen = self._seen_health.get(slot, 0)
        posted = self.health.read(slot, generation, seen)
        if posted is None or posted.data is None:
            return []
        self._seen_health[slot] = posted.seq
        # Two per post; a first read, or a slot's new backend, counts one check.
        checks = (posted.seq - seen) // 2 if 0 < seen < posted.seq else 1
        return [posted.data.decode()] * min(checks, MAX_REPLAYED)

    def close(self) -> None:
        self.metrics.close()
        self.health.close()


# Enough checks in a row for any health verdict (a backend goes down after a few failures).
MAX_REPLAYED = 8
