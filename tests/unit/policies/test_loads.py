from __future__ import annotations

from typing import Any

import pytest

from fleet.types import EngineMetrics
from policies.loads import batch_size, queue_size, running_size
from tests.unit.policies.builders import backend

CASES: list[dict[str, Any]] = [
    {},
    {"in_flight": 5},
    {"in_flight": 2, "scraped": EngineMetrics(running=3, waiting=4)},
    {"in_flight": 9, "decoding": 4, "scraped": EngineMetrics(running=3, waiting=1)},
    {"scraped": EngineMetrics()},
]


@pytest.mark.parametrize("kw", CASES)
def test_batch_size_is_the_larger_of_own_accounting_and_scrape(kw: dict[str, Any]) -> None:
    b = backend("b", **kw)
    scraped = kw.get("scraped")
    expected = max(kw.get("in_flight", 0), scraped.running + scraped.waiting if scraped else 0)
    assert batch_size(b) == expected


@pytest.mark.parametrize(
    ("kw", "queue", "running"),
    [
        ({}, 0, 0),
        ({"in_flight": 6, "decoding": 2}, 4, 2),
        ({"in_flight": 6, "decoding": 2, "scraped": EngineMetrics(running=5, waiting=7)}, 7, 5),
    ],
)
def test_queue_and_running(kw: dict[str, Any], queue: float, running: float) -> None:
    b = backend("b", **kw)
    assert (queue_size(b), running_size(b)) == (queue, running)
