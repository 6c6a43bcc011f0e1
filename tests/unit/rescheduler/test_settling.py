"""An instance that took part in a move is settling until a scrape taken after the move."""

from __future__ import annotations

from rescheduler.executor import MoveOutcome
from rescheduler.settling import Settling
from rescheduler.view import ClusterView, InferType, InstanceView


def fleet(taken_at: float, scraped: dict[str, float | None]) -> ClusterView:
    return ClusterView(
        taken_at,
        tuple(InstanceView(i, InferType.NEUTRAL, scraped_at=t) for i, t in scraped.items()),
    )


def settling(view: ClusterView) -> set[str]:
    return {i.id for i in view.instances if i.settling}


def moved(outcome: str, source: str = "a", target: str = "b") -> MoveOutcome:
    return MoveOutcome("neutral_load", "k", source, target, outcome)


def test_nothing_moved_nothing_settles() -> None:
    s = Settling()
    view = fleet(10.0, {"a": 9.9, "b": 9.9})
    assert s.apply(view) is view


def test_both_ends_settle_until_a_scrape_later_than_the_first_view_after_the_move() -> None:
    s = Settling()
    s.moved([moved("ok")])
    # The first view after the move: its scrapes may predate the move's end.
    assert settling(s.apply(fleet(10.0, {"a": 9.9, "b": 9.9, "c": 9.9}))) == {"a", "b"}
    # a was scraped after that view, b not yet.
    assert settling(s.apply(fleet(10.2, {"a": 10.1, "b": 10.0, "c": 10.1}))) == {"b"}
    assert settling(s.apply(fleet(10.4, {"a": 10.3, "b": 10.3, "c": 10.3}))) == set()


def test_a_never_scraped_instance_stays_settling() -> None:
    s = Settling()
    s.moved([moved("ok")])
    s.apply(fleet(10.0, {"a": 9.9, "b": None}))
    assert settling(s.apply(fleet(11.0, {"a": 10.5, "b": None}))) == {"b"}


def test_a_move_that_timed_out_may_still_land_one_that_failed_did_not() -> None:
    s = Settling()
    s.moved([moved("timeout"), moved("failed", "c", "d"), moved("not_movable", "e", "f")])
    view = fleet(10.0, dict.fromkeys("abcdef", 9.9))
    assert settling(s.apply(view)) == {"a", "b"}


def test_a_removed_instance_is_forgotten() -> None:
    s = Settling()
    s.moved([moved("ok")])
    s.apply(fleet(10.0, {"b": 9.9}))  # a left the fleet
    # a is back (re-added with the same id) and scraped long ago: not settling.
    assert settling(s.apply(fleet(10.2, {"a": 5.0, "b": 10.1}))) == set()
