"""One backend's KV-event stream in order: the decision core of a subscriber. No I/O.

Batches carry consecutive sequence numbers from 0, per publisher. Given each live batch, the
stream decides:
- the next number: apply it to the index;
- a number past the next (batches were lost): ask for a replay from the first one missing,
  or, with no replay endpoint (or a replay that does not cover the hole), start the
  backend's index over, incomplete (a resync);
- a number at or below the last one that a replay did not already deliver: the publisher
  restarted (a new engine process, whose cache is empty): start over;
- the first batch seen: start; complete when it is number 0, or when a replay from 0 still
  has every batch before it.
With a replay endpoint the subscriber also asks for everything from 0 as it subscribes
(`joined`): an engine that is idle when the proxy starts is then known, and trusted, at once
instead of after the warm-up, when its replay buffer still holds its whole history.
The subscriber loop does the socket work: it calls `live`, and when that returns a sequence
number, fetches the replay from there and hands it to `replayed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from fleet.kv_events import EventBatch
from fleet.precise_prefix import PrecisePrefixIndex

Why = Literal["start", "restart", "gap"]

# Batches at the end of the subscribe-time replay kept to recognise their live copies: those
# published between the subscription and the replay's answer, a few engine steps at most.
JOIN_TAIL = 64


@dataclass(slots=True)
class StreamCounters:
    batches: int = 0  # applied, live or replayed
    events: int = 0
    duplicates: int = 0  # live batches a replay had already delivered
    undecodable: int = 0  # messages or replayed batches that did not decode
    gaps: int = 0  # holes in the sequence seen live
    replays: int = 0  # replays that filled a hole or a late start
    resyncs: dict[str, int] = field(default_factory=dict)  # reason (gap, restart) -> count


class KvEventStream:
    def __init__(self, backend_id: str, index: PrecisePrefixIndex, *, can_replay: bool) -> None:
        self.backend_id = backend_id
        self.index = index
        self.can_replay = can_replay
        self.counters = StreamCounters()
        self._last: int | None = None
        # Live batches numbered above this, up to _last, came first by replay: duplicates.
        # (Only those: a lower number after a replay is a publisher that restarted.)
        self._replayed_above: int | None = None
        self._waiting: tuple[int, EventBatch, Why] | None = None  # held for a replay
        self._joined_tail: dict[int, EventBatch] | None = None  # see `joined`

    @property
    def last_seq(self) -> int | None:
        return self._last

    def live(self, seq: int, batch: EventBatch, now: float) -> int | None:
        """Take a live batch; a number back means: replay from there, then call `replayed`."""
        last = self._last
        if last is not None and seq == last + 1:
            self._replayed_above = None  # past what a replay delivered
            self._joined_tail = None
            self._apply(seq, batch, now)
            return None
        tail = self._joined_tail
        if tail is not None and last is not None and seq <= last and tail.get(seq) == batch:
            self.counters.duplicates += 1
            return None
        if last is not None and seq > last:
            self.counters.gaps += 1
            return self._recover(seq, batch, "gap", now, last + 1)
        if last is not None and self._replayed_above is not None and seq > self._replayed_above:
            self.counters.duplicates += 1
            return None
        why: Why = "start" if last is None else "restart"
        if seq == 0:
            self._start(why, now, complete=True)
            self._apply(seq, batch, now)
            return None
        return self._recover(seq, batch, why, now, 0)

    def _recover(self, seq: int, batch: EventBatch, why: Why, now: float, since: int) -> int | None:
        if self.can_replay:
            self._waiting = (seq, batch, why)
            return since
        self._give_up(seq, batch, why, now)
        return None

    def joined(
        self, batches: Sequence[tuple[int, EventBatch]], reached_end: bool, now: float
    ) -> None:
        """The replay from 0 asked on subscribing, before any live batch was taken: the
        publisher's whole history when the answer is consecutive from 0 and reached the end
        marker (none at all: nothing published yet). Anything else (a buffer that no longer
        starts at 0, a replay that failed) decides nothing: live batches start as usual."""
        if self._last is not None or self._waiting is not None or not reached_end:
            return
        if any(s != i for i, (s, _) in enumerate(batches)):
            return
        self._start("start", now, complete=True)
        if not batches:
            return
        self.counters.replays += 1
        for s, b in batches:
            self._apply(s, b, now)
        # Live copies of the replay's last batches may follow (published after subscribing,
        # before the answer): the same batch again is one of those, another batch under an
        # old number is a restarted publisher's. Only the tail can be copied, so only it is
        # kept, until the first live batch past the replay.
        self._joined_tail = dict(batches[-JOIN_TAIL:])

    def replayed(self, batches: Sequence[tuple[int, EventBatch]], now: float) -> None:
        """The replay's batches in the order received (none when it failed)."""
        if self._waiting is None:
            return
        seq, batch, why = self._waiting
        self._waiting = None
        since = 0 if why != "gap" or self._last is None else self._last + 1
        run: list[tuple[int, EventBatch]] = []
        for s, b in batches:
            if s != since + len(run):
                break
            run.append((s, b))
        if not run or since + len(run) <= seq - 1:
            self._give_up(seq, batch, why, now)
            return
        self.counters.replays += 1
        if why != "gap":
            self._start(why, now, complete=True)  # everything since the publisher began
        for s, b in run:
            self._apply(s, b, now)
        self._replayed_above = seq
        if seq > since + len(run) - 1:
            self._apply(seq, batch, now)  # the live batch just past the replay's end

    def _give_up(self, seq: int, batch: EventBatch, why: Why, now: float) -> None:
        """No replay: start over from this batch, without what came before it."""
        self._start(why, now, complete=False)
        self._apply(seq, batch, now)

    def _start(self, why: Why, now: float, *, complete: bool) -> None:
        if why != "start":
            self.counters.resyncs[why] = self.counters.resyncs.get(why, 0) + 1
        self.index.reset(self.backend_id, now, complete=complete)
        self._last = None
        self._replayed_above = None
        self._joined_tail = None

    def _apply(self, seq: int, batch: EventBatch, now: float) -> None:
        self.index.apply(self.backend_id, batch.events, now)
        self._last = seq
        self.counters.batches += 1
        self.counters.events += len(batch.events)
