"""Following custom resources: the InferenceObjectives book (pure), and the list-then-watch
loop's fallback to listing again when the watch cannot be had, driven by an in-memory API
(the real API's watch is tested over kmock in tests/integration/gateway)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import pytest

from fleet.inference_objectives import ObjectiveBook
from fleet.kube import Gone
from fleet.kube_resources import ResourceEvent, ResourceKind, follow_resources, resource_event


def objective(name: str, pool: str, priority: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"name": pool}}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name}, "spec": spec}


def test_the_book_keeps_the_pools_objectives_and_their_priorities() -> None:
    book = ObjectiveBook("pool-a")
    book.replace(
        [objective("batch", "pool-a", -1), objective("chat", "pool-a"), objective("x", "b")]
    )
    assert (book.priority("batch"), book.priority("chat"), book.priority("x")) == (-1, 0, None)
    book.apply("MODIFIED", objective("batch", "pool-b", -1))  # moved to another pool
    book.apply("DELETED", objective("chat", "pool-a"))
    book.apply(
        "ADDED",
        {"metadata": {"name": "many"}, "spec": {"poolRefs": [{"name": "pool-a"}], "priority": 7}},
    )
    assert len(book) == 1 and book.priority("many") == 7


def test_a_watch_error_of_410_is_gone_and_others_fail() -> None:
    with pytest.raises(Gone):
        resource_event({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    with pytest.raises(RuntimeError, match="500"):
        resource_event({"type": "ERROR", "object": {"code": 500}})
    event = resource_event({"type": "MODIFIED", "object": {"metadata": {"resourceVersion": "7"}}})
    assert (event.type, event.resource_version) == ("MODIFIED", "7")


class NoWatchApi:
    """Lists what `listed` holds now; refuses every watch, as an API without the verb does."""

    def __init__(self) -> None:
        self.listed: list[dict[str, Any]] = []
        self.lists = 0

    async def list_custom_objects(
        self, group: str, version: str, namespace: str, plural: str
    ) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return list(self.listed), str(self.lists)

    async def watch_custom_objects(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        resource_version: str,
        timeout_s: int,
    ) -> AsyncIterator[ResourceEvent]:
        raise RuntimeError("watch is forbidden")
        yield  # an async generator, as the real one


class Recorded:
    def __init__(self) -> None:
        self.names: set[str] = set()

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.names = {i["metadata"]["name"] for i in items}

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        raise AssertionError("no watch, no events")


async def test_without_a_watch_the_resources_are_listed_again_every_retry() -> None:
    api, sink = NoWatchApi(), Recorded()
    kind = ResourceKind("g", "v1", "things")
    task = asyncio.create_task(follow_resources(api, kind, "ns", sink, retry_s=0.01))
    try:
        for _ in range(500):  # bounded: 5 s at most
            if api.lists >= 2:
                break
            await asyncio.sleep(0.01)
        api.listed = [{"metadata": {"name": "new"}}]
        before = api.lists
        for _ in range(500):
            if sink.names == {"new"}:
                break
            await asyncio.sleep(0.01)
        assert sink.names == {"new"} and api.lists > before
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
