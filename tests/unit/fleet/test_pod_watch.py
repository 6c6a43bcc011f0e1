"""The pod watcher: its pure core (events applied to a pod set, backoff) and its loop over an
in-memory KubeApi with scripted watch streams."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from fleet.kube import EventType, Gone, PodList, WatchEvent, pod_from_json, watch_event
from fleet.pod_watch import PodSet, PodWatcher, applied, backoff_s, relisted
from tests.support.fake_kube import FakeKube, ready_pod
from tests.support.polling import eventually

A, B = ready_pod("a", "10.0.0.1"), ready_pod("b", "10.0.0.2")


def test_events_are_applied_and_every_event_moves_the_version() -> None:
    state = relisted(PodList([A], "10"))
    state = applied(state, WatchEvent(EventType.ADDED, "11", B))
    assert set(state.pods) == {"a", "b"} and state.resource_version == "11"
    moved = ready_pod("b", "10.0.0.9")
    state = applied(state, WatchEvent(EventType.MODIFIED, "12", moved))
    assert state.pods["b"].pod_ip == "10.0.0.9"
    state = applied(state, WatchEvent(EventType.DELETED, "13", A))
    assert set(state.pods) == {"b"}
    state = applied(state, WatchEvent(EventType.BOOKMARK, "40"))
    assert set(state.pods) == {"b"} and state.resource_version == "40"


def test_watch_lines_parse_and_410_is_gone() -> None:
    bookmark = watch_event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}})
    assert bookmark == WatchEvent(EventType.BOOKMARK, "7")
    with pytest.raises(Gone):
        watch_event({"type": "ERROR", "object": {"kind": "Status", "code": 410}})
    with pytest.raises(RuntimeError, match="500"):
        watch_event({"type": "ERROR", "object": {"code": 500}})
    pod = pod_from_json({
        "metadata": {"name": "p", "namespace": "ns", "deletionTimestamp": "2024-01-01T00:00:00Z"},
        "status": {"podIP": "10.1.1.1", "phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })  # fmt: skip
    assert pod.ready and pod.deletion_timestamp is not None and not pod.serving


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_s(n, 0.5, 3.0) for n in range(5)] == [0.0, 0.5, 1.0, 2.0, 3.0]


async def run_until(watcher: PodWatcher, done: Callable[[], bool]) -> None:
    task = asyncio.create_task(watcher.run())
    try:
        # Once per scheduler turn: the fake API answers without a clock.
        await eventually(done, within=5, what="the watcher got there", every=0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def no_sleep(_: float) -> None:
    await asyncio.sleep(0)


async def test_watcher_follows_bookmarks_and_relists_after_gone() -> None:
    kube = FakeKube(pods={"a": A})
    kube.watch_scripts = [
        [WatchEvent(EventType.ADDED, "200", B), WatchEvent(EventType.BOOKMARK, "250")],
        [Gone("too old")],
    ]
    seen: list[set[str]] = []
    watcher = PodWatcher(kube, "ns", "app=x", sleep=no_sleep,
                         on_change=lambda s: seen.append(set(s.pods)))  # fmt: skip
    await run_until(watcher, lambda: watcher.lists >= 2)
    # Listed at 101, watched from there, then from the bookmark's version; 410: listed again.
    assert kube.watch_calls[:2] == ["101", "250"]
    assert seen[:2] == [{"a"}, {"a", "b"}]
    assert set(watcher.state.pods) == {"a"}  # the re-list is the truth: b was never created


async def test_watcher_backs_off_after_errors() -> None:
    kube = FakeKube()
    kube.watch_scripts = [[RuntimeError("connection reset")], [RuntimeError("again")]]
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)
        await asyncio.sleep(0)

    watcher = PodWatcher(kube, "ns", "app=x", sleep=sleep, max_backoff_s=4.0)
    await run_until(watcher, lambda: len(waits) >= 4)
    assert waits[:2] == [0.5, 1.0]  # doubling; the failed watches resume without a re-list
    assert watcher.lists == 1
    assert isinstance(watcher.state, PodSet)
