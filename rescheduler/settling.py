"""Which instances are settling: a migration to or from them ended after their last scrape.

An engine's /metrics shows a move only at the next scrape, some hundreds of milliseconds
later; a cycle that ran on the older numbers would see the source still full and the target
still empty, and move the same load again (or, the cycle after, back). So an instance that
took part in a move is marked `settling` until a scrape taken after the move: balancing and
binpacking leave it alone until then (failover does not).

The times are the view's own (the proxy's clock), never this process's, so the rule holds
for a standalone rescheduler too: a move ends before the next view is taken, so an instance
has settled once its `scraped_at` is later than the `taken_at` of the first view after the
move. Pure: it only reads the outcomes and views it is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from rescheduler.executor import MoveOutcome
from rescheduler.view import ClusterView

# Outcomes after which the request is (or may soon be) on its target: a move that timed out
# may still land.
_MOVED = frozenset({"ok", "timeout"})


class Settling:
    def __init__(self) -> None:
        # Instance id -> the taken_at a scrape must be later than; None: the next view's.
        self._after: dict[str, float | None] = {}

    def moved(self, outcomes: Iterable[MoveOutcome]) -> None:
        for o in outcomes:
            if o.outcome in _MOVED:
                self._after[o.source] = None
                self._after[o.target] = None

    def apply(self, view: ClusterView) -> ClusterView:
        """`view` with its settling instances marked."""
        if not self._after:
            return view
        present = {i.id for i in view.instances}
        for instance_id in list(self._after):
            if instance_id not in present:
                del self._after[instance_id]  # removed from the fleet
            elif self._after[instance_id] is None:
                self._after[instance_id] = view.taken_at
        instances = []
        for i in view.instances:
            after = self._after.get(i.id)
            if after is None:
                instances.append(i)
            elif i.scraped_at is not None and i.scraped_at > after:
                del self._after[i.id]
                instances.append(i)
            else:
                instances.append(replace(i, settling=True))
        return replace(view, instances=tuple(instances))
