"""A backend's event stream in order, without sockets: the next batch applies, a hole asks
for a replay (or starts over without one), a publisher that restarted starts over."""

from __future__ import annotations

from fleet.kv_event_stream import KvEventStream
from fleet.kv_events import BlockStored, EventBatch
from fleet.precise_prefix import PrecisePrefixIndex


def batch(n: int) -> EventBatch:
    """Batch n stores one root block of tokens [n] * 4 (engine hash n)."""
    return EventBatch(float(n), [BlockStored([n], None, [n] * 4, 4)])


def held(index: PrecisePrefixIndex, *ns: int) -> list[int]:
    return [index.match([n] * 4).blocks("e") for n in ns]


def stream(can_replay: bool) -> tuple[KvEventStream, PrecisePrefixIndex]:
    index = PrecisePrefixIndex(warmup_s=30.0)
    return KvEventStream("e", index, can_replay=can_replay), index


def test_a_stream_seen_from_zero_is_complete_at_once() -> None:
    s, index = stream(can_replay=False)
    for n in range(3):
        assert s.live(n, batch(n), 0.0) is None
    assert held(index, 0, 1, 2) == [1, 1, 1]
    assert index.precise("e", 0.0)
    assert (s.counters.batches, s.counters.events, s.last_seq) == (3, 3, 2)


def test_joining_late_replays_from_zero_when_it_can() -> None:
    s, index = stream(can_replay=True)
    assert s.live(2, batch(2), 0.0) == 0
    s.replayed([(0, batch(0)), (1, batch(1)), (2, batch(2)), (3, batch(3))], 0.0)
    assert held(index, 0, 1, 2, 3) == [1, 1, 1, 1]
    assert index.precise("e", 0.0) and s.counters.replays == 1
    # The live batches the replay already delivered are skipped; the next one applies.
    assert s.live(3, batch(3), 0.0) is None
    assert s.counters.duplicates == 1
    assert s.live(4, batch(4), 0.0) is None and s.last_seq == 4


def test_joining_late_without_history_warms_up() -> None:
    s, index = stream(can_replay=True)
    assert s.live(7, batch(7), 0.0) == 0
    s.replayed([(5, batch(5)), (6, batch(6)), (7, batch(7))], 0.0)  # 0 is gone
    assert held(index, 5, 7) == [0, 1]
    assert not index.precise("e", 29.0) and index.precise("e", 30.0)
    assert s.counters.resyncs == {}  # a late start is no resync


def test_a_gap_is_filled_by_a_replay() -> None:
    s, index = stream(can_replay=True)
    s.live(0, batch(0), 0.0)
    assert s.live(3, batch(3), 1.0) == 1
    s.replayed([(1, batch(1)), (2, batch(2))], 1.0)  # ends just before the live one
    assert held(index, 0, 1, 2, 3) == [1, 1, 1, 1]
    assert (s.counters.gaps, s.counters.replays, s.counters.resyncs) == (1, 1, {})
    assert index.precise("e", 1.0) and s.last_seq == 3


def test_a_gap_without_replay_starts_over_incomplete() -> None:
    for can_replay, answer in ((False, None), (True, [(2, batch(2))])):  # missing 1
        s, index = stream(can_replay)
        s.live(0, batch(0), 0.0)
        since = s.live(3, batch(3), 5.0)
        if can_replay:
            assert since == 1 and answer is not None
            s.replayed(answer, 5.0)
        assert held(index, 0, 3) == [0, 1]
        assert s.counters.resyncs == {"gap": 1}
        assert not index.precise("e", 34.0) and index.precise("e", 35.0)


def test_a_publisher_restart_starts_over() -> None:
    s, index = stream(can_replay=False)
    for n in range(3):
        s.live(n, batch(n), 0.0)
    s.live(0, batch(9), 1.0)  # a new engine process
    assert held(index, 0, 9) == [0, 1]
    assert s.counters.resyncs == {"restart": 1}
    assert index.precise("e", 1.0)  # its cache began empty
    s.live(1, batch(10), 2.0)  # the new process goes on
    s.live(2, batch(11), 2.0)
    # Restarted again, its batch 0 missed, nothing to replay: started over incomplete.
    s.live(1, batch(12), 3.0)
    assert s.counters.resyncs == {"restart": 2}
    assert held(index, 10, 11, 12) == [0, 0, 1]
    assert not index.precise("e", 3.0)


def test_a_restart_right_after_a_replay_is_no_duplicate() -> None:
    s, index = stream(can_replay=True)
    assert s.live(2, batch(2), 0.0) == 0
    s.replayed([(0, batch(0)), (1, batch(1)), (2, batch(2)), (3, batch(3))], 0.0)
    # Batch 3 came live after the replay delivered it; then the engine restarts at 0.
    assert s.live(3, batch(3), 0.0) is None
    assert s.live(0, batch(20), 1.0) is None
    assert s.counters.duplicates == 1 and s.counters.resyncs == {"restart": 1}
    assert held(index, 3, 20) == [0, 1]


def test_joining_with_the_whole_history_is_complete_before_any_live_batch() -> None:
    s, index = stream(can_replay=True)
    assert not index.precise("e", 0.0)
    s.joined([(0, batch(0)), (1, batch(1))], True, 0.0)
    assert held(index, 0, 1) == [1, 1]
    assert index.precise("e", 0.0) and s.last_seq == 1 and s.counters.replays == 1
    # Published while the replay was answered: they came by the replay first.
    assert s.live(0, batch(0), 0.0) is None and s.live(1, batch(1), 0.0) is None
    assert s.counters.duplicates == 2 and s.counters.resyncs == {}
    assert s.live(2, batch(2), 0.0) is None and held(index, 2) == [1]


def test_after_a_join_another_batch_under_an_old_number_is_a_restart() -> None:
    s, index = stream(can_replay=True)
    s.joined([(0, batch(0)), (1, batch(1))], True, 0.0)
    assert s.live(0, batch(7), 1.0) is None  # a new publisher's first batch
    assert s.counters.resyncs == {"restart": 1} and s.counters.duplicates == 0
    assert held(index, 0, 1, 7) == [0, 0, 1] and index.precise("e", 1.0)


def test_joining_an_engine_that_published_nothing_is_complete_and_empty() -> None:
    s, index = stream(can_replay=True)
    s.joined([], True, 0.0)
    assert index.precise("e", 0.0) and index.blocks("e") == 0
    assert s.live(0, batch(0), 1.0) is None and held(index, 0) == [1]


def test_a_join_that_cannot_show_the_whole_history_decides_nothing() -> None:
    for answer, reached_end in (
        ([(4, batch(4)), (5, batch(5))], True),  # the buffer no longer starts at 0
        ([(0, batch(0))], False),  # the replay timed out before its end
    ):
        s, index = stream(can_replay=True)
        s.joined(answer, reached_end, 0.0)
        assert not index.precise("e", 0.0) and index.blocks("e") == 0
        assert s.last_seq is None and s.counters.replays == 0
        assert s.live(6, batch(6), 0.0) == 0  # the first live batch asks for a replay as before
