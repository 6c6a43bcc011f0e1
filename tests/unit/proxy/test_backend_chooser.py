"""The first leg's choice with backends to avoid (those flow control saw with no room)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest

from fleet.types import Backend
from policies.policy import Decision, NoCandidate, RequestContext
from proxy.errors import ProxyError
from proxy.ports import RequestServices
from proxy.request.choosing import BackendChooser
from tests.unit.policies.builders import ctx, fleet


class FirstOf:
    """Picks the first candidate it is offered; refuses a set without `needs` in it (as a
    prefill/decode policy refuses a set without a decode backend)."""

    def __init__(self, needs: str | None = None) -> None:
        self.needs = needs
        self.offered: list[list[str]] = []

    def pick(self, _ctx: RequestContext, candidates: Sequence[Backend], _now: float) -> Decision:
        ids = [b.id for b in candidates]
        self.offered.append(ids)
        if self.needs is not None and self.needs not in ids:
            raise NoCandidate(f"no {self.needs}")
        return Decision(target=candidates[0], reason="first")


class Fleet:
    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends

    def candidates(self, _model: str, _now: float) -> list[Backend]:
        return list(self.backends)


class Clock:
    def now(self) -> float:
        return 0.0


def chooser(policy: FirstOf, n: int = 3) -> BackendChooser:
    core: Any = type("Core", (), {})()
    core.fleet, core.policy, core.clock = Fleet(fleet(n)), policy, Clock()
    return BackendChooser(cast(RequestServices, core))


def test_the_backends_to_avoid_are_passed_over() -> None:
    policy = FirstOf()
    assert chooser(policy).choose(ctx(), [], first=True, avoid=("b0",)).target.id == "b1"
    assert policy.offered == [["b1", "b2"]]


def test_when_the_policy_cannot_pick_among_the_others_they_are_candidates_again() -> None:
    policy = FirstOf(needs="b0")
    assert chooser(policy).choose(ctx(), [], first=True, avoid=("b0",)).target.id == "b0"
    assert policy.offered == [["b1", "b2"], ["b0", "b1", "b2"]]


def test_avoiding_every_backend_leaves_them_all_candidates() -> None:
    policy = FirstOf()
    assert chooser(policy, 2).choose(ctx(), [], first=True, avoid=("b0", "b1")).target.id == "b0"
    assert policy.offered == [["b0", "b1"]]


def test_a_policy_that_finds_nothing_at_all_still_answers_503() -> None:
    with pytest.raises(ProxyError) as e:
        chooser(FirstOf(needs="b9")).choose(ctx(), [], first=True, avoid=("b0",))
    assert e.value.status == 503
