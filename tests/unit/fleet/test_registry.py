"""FleetRegistry read by a /metrics scrape thread while the loop adds or removes backends."""

from __future__ import annotations

from collections.abc import Callable

from fleet.registry import FleetRegistry
from fleet.types import Backend, BackendSpec


class ModelsThatAct(tuple[str, ...]):
    """A backend's model list that runs `act` the first time it is asked about a model: the
    registry changing in the middle of a read, as it may when the read runs on another thread."""

    act: Callable[[], None] | None = None

    def __contains__(self, item: object) -> bool:
        act, type(self).act = type(self).act, None
        if act is not None:
            act()
        return super().__contains__(item)


def fleet_whose_first_backend_adds_another() -> FleetRegistry:
    fleet = FleetRegistry(stale_after=1.0)
    ModelsThatAct.act = lambda: fleet.add(BackendSpec("late", "http://late", models=("m",)))
    fleet.add(BackendSpec("a", "http://a", models=ModelsThatAct(("m",))))
    fleet.add(BackendSpec("b", "http://b", models=("m",)))
    return fleet


def test_candidates_survive_a_backend_added_while_they_are_read() -> None:
    fleet = fleet_whose_first_backend_adds_another()
    # Not scraped yet, so none is a candidate; the point is that the read does not raise.
    assert fleet.candidates("m", now=0.0) == []
    assert "late" in {b.id for b in fleet}


def test_knows_model_survives_a_backend_added_while_it_reads() -> None:
    fleet = fleet_whose_first_backend_adds_another()
    assert not fleet.knows_model("other")
    assert len(fleet) == 3


class Learned:
    def __init__(self) -> None:
        self.told: list[tuple[str, tuple[str, ...]]] = []

    def models_learned(self, backend: Backend) -> None:
        self.told.append((backend.id, backend.spec.models))


def test_models_learned_from_a_backend_are_set_then_told_to_listeners() -> None:
    fleet = FleetRegistry(stale_after=1.0)
    b = fleet.add(BackendSpec(id="b", url="http://127.0.0.1:1"))
    listener = Learned()
    fleet.on_models_learned(listener)
    fleet.models_learned(b, ("llama", "sql"), frozenset({"sql"}))
    assert listener.told == [("b", ("llama", "sql"))]
    assert fleet.is_adapter("sql")
    # Set by the proxy itself (an adapter it loaded): no listener is told.
    fleet.set_models(b, ("llama",))
    assert len(listener.told) == 1
