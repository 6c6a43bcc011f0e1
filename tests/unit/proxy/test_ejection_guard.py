"""The ejection loop's stall rule, on a proxy core with an injected clock: a backend holding a
request that waits with nothing coming from it is ejected, its requests leave it, and one that
reaches it anyway while it is out (it was still connecting when the others were freed) is
freed at the next tick rather than after read_timeout."""

from __future__ import annotations

from typing import Any

from fleet.clock import FakeClock
from fleet.live import MoveResult
from fleet.types import Backend
from proxy.serving.wiring import ProxyCore
from proxy.settings import load_settings

STALL_S = 1.0


class WaitingRequest:
    """A live request waiting for its backend's first output since `since`."""

    def __init__(self, name: str, backend_id: str, since: float) -> None:
        self.request_id = self.upstream_request_id = name
        self.backend_id = backend_id
        self.since = self.arrived_at = since
        self.running = False
        self.charged_prompt_tokens = self.tokens_generated = 0
        self.freed: list[str] = []

    def movable_reason(self, planned: bool) -> str:
        return "not_generation"

    def view(self) -> dict[str, Any]:
        return {"request_id": self.request_id}

    def backend_down(self, why: str) -> None:
        self.freed.append(why)

    def waiting_since(self) -> float | None:
        return None if self.freed else self.since

    def last_read(self) -> float:
        return 0.0

    async def move(
        self, to: Backend | None = None, reason: str = "admin", *, kind: str | None = None
    ) -> MoveResult:
        raise AssertionError("not moved here")


def make_core() -> tuple[ProxyCore, FakeClock]:
    clock = FakeClock()
    settings = load_settings(
        {
            "backends": [
                {"url": "http://127.0.0.1:9", "id": "a"},
                {"url": "http://127.0.0.1:19", "id": "b"},
            ],
            "stall_timeout": STALL_S,
        }
    )
    return ProxyCore(settings, clock), clock


def ejected_until(core: ProxyCore, backend_id: str) -> float:
    backend = core.fleet.get(backend_id)
    assert backend is not None
    return backend.ejected_until


def test_a_stalled_backend_is_ejected_and_its_waiting_requests_leave_it() -> None:
    core, clock = make_core()
    stuck = WaitingRequest("r1", "a", clock.now())
    core.live.add(stuck)
    clock.advance(STALL_S / 2)
    core.ejection.tick()
    assert stuck.freed == [] and ejected_until(core, "a") == 0.0  # not waiting long enough
    recent = WaitingRequest("r2", "b", clock.now())
    core.live.add(recent)
    clock.advance(STALL_S)
    core.ejection.tick()
    assert stuck.freed == ["its backend stalled"]
    assert ejected_until(core, "a") > clock.now()
    assert recent.freed == [] and ejected_until(core, "b") == 0.0


def test_a_request_that_reaches_a_backend_already_out_for_a_stall_is_freed_at_the_next_tick() -> (
    None
):
    core, clock = make_core()
    first = WaitingRequest("r1", "a", clock.now())
    core.live.add(first)
    clock.advance(STALL_S * 1.5)
    core.ejection.tick()
    assert first.freed == ["its backend stalled"]
    until = ejected_until(core, "a")
    # Written to `a` after that sweep: it was connecting while the others were freed.
    late = WaitingRequest("r2", "a", clock.now())
    core.live.add(late)
    clock.advance(STALL_S / 2)
    core.ejection.tick()
    assert late.freed == []  # not waiting long enough yet to tell
    clock.advance(STALL_S)
    core.ejection.tick()
    assert late.freed == ["its backend stalled"]
    assert ejected_until(core, "a") == until  # the ejection is not renewed by it
