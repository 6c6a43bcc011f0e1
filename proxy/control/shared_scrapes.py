"""One worker scrapes every backend's /metrics, the others read its results (`--workers N`).

The first worker (index 0) scrapes and posts each backend's parsed metrics to the shared
board (fleet/metrics_board.py); every other worker takes them from there at its own scrape
interval, as if it had scraped them, one interval late at most. Health checks and /v1/models
stay with every worker (they decide what each worker's own requests may use, and cost far
less than a /metrics page). A backend without a shared slot, or whose metrics do not fit its
cell, is scraped by every worker as before.
"""

from __future__ import annotations

from fleet.metrics_board import MetricsBoard
from fleet.peer_load import SlotTable
from fleet.types import Backend, MetricsSnapshot


class SharedScrapes:
    """This worker's side of the board: `MetricsShare` (fleet/scrape.py)."""

    def __init__(self, board: MetricsBoard, slots: SlotTable, *, scraper: bool) -> None:
        self.board = board
        self.slots = slots  # PeerSync's, kept current by the change log
        self.scraper = scraper
        self._seen: dict[int, int] = {}  # slot -> seq of the cell last taken
        # (slot, generation) of the backends whose metrics the scraper could not post.
        self._too_large: set[tuple[int, int]] = set()

    def scrapes(self, backend: Backend) -> bool:
        if self.scraper:
            return True
        entry = self.slots.get(backend.id)
        return entry is None or entry in self._too_large

    def posted(self, backend: Backend, snapshot: MetricsSnapshot) -> None:
        if not self.scraper:
            return
        entry = self.slots.get(backend.id)
        if entry is not None:
            self.board.post(entry[0], entry[1], snapshot.taken_at, snapshot.metrics)

    def newer(self, backend: Backend) -> MetricsSnapshot | None:
        """The scraping worker's snapshot of `backend`, when newer than the last one taken."""
        entry = self.slots.get(backend.id)
        if self.scraper or entry is None:
            return None
        slot, generation = entry
        posted = self.board.read(slot, generation, self._seen.get(slot, 0))
        if posted is None:
            return None
        self._seen[slot] = posted.seq
        if posted.metrics is None:
            self._too_large.add(entry)
            return None
        self._too_large.discard(entry)
        return MetricsSnapshot(taken_at=posted.taken_at, metrics=posted.metrics)

    def close(self) -> None:
        self.board.close()
