from __future__ import annotations

from typing import Any

import pytest

from fleet.types import EngineMetrics
from policies.loads import batch_size, queue_size, running_size
from tests.unit.policies.builders import backend


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, 0),
        ({"in_flight": 5}, 5),  # no scrape yet: the proxy's own count
        ({"in_flight": 2, "scraped": EngineMetrics(running=3, waiting=4)}, 7),  # scrape larger
        ({"in_flight": 9, "decoding": 4, "scraped": EngineMetrics(running=3, waiting=1)}, 9),
        ({"scraped": EngineMetrics()}, 0),
    ],
)
def test_batch_size_is_the_larger_of_own_accounting_and_scrape(
    kw: dict[str, Any], expected: float
) -> None:
    assert batch_size(backend("b", **kw)) == expected


def test_batch_size_counts_the_other_workers_in_flight() -> None:
    b = backend("b", in_flight=2, scraped=EngineMetrics(running=3, waiting=0))
    b.load.peer_in_flight = 4
    assert batch_size(b) == 6


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
