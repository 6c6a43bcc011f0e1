"""The one owner of backend health (`BackendHealth`), on a proxy core with an injected clock.

Active health: the scraper's checks, answered by respx, take a backend out after
`unhealthy_after` failures in a row and bring it back at a pass; crossing the threshold frees
the requests still on the backend. Passive health: a refused connection or a broken stream
takes it out until a pass. Outcome-based ejection: failures in a row eject a backend until the
clock passes its end; a backend holding a request that waits with nothing coming from it is
ejected, its requests leave it, and one that reaches it anyway while it is out (it was still
connecting when the others were freed) is freed at the next tick rather than after
read_timeout."""

from __future__ import annotations

from typing import Any

import httpx
import respx

from fleet.clock import FakeClock
from fleet.live import MoveResult
from fleet.scrape import Scraper
from fleet.types import Backend
from proxy.serving.wiring import ProxyCore
from proxy.settings import load_settings

STALL_S = 1.0
EJECTION_S = 10.0
FOUND_DOWN = "its backend was found down by a health check"


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
                {"url": "http://a.test", "id": "a"},
                {"url": "http://b.test", "id": "b"},
            ],
            "stall_timeout": STALL_S,
            "outlier_consecutive_failures": 2,
            "outlier_base_ejection": EJECTION_S,
        }
    )
    return ProxyCore(settings, clock), clock


def backend(core: ProxyCore, backend_id: str) -> Backend:
    found = core.fleet.get(backend_id)
    assert found is not None
    return found


def ejected_until(core: ProxyCore, backend_id: str) -> float:
    return backend(core, backend_id).ejected_until


def scraper(core: ProxyCore, client: httpx.AsyncClient) -> Scraper:
    return Scraper(core.fleet, client, core.clock, health=core.health)


@respx.mock
async def test_one_failed_health_check_is_tolerated_two_take_a_backend_out_a_pass_brings_it_back() -> (
    None
):
    core, _ = make_core()
    a = backend(core, "a")
    route = respx.get("http://a.test/health")
    async with httpx.AsyncClient() as client:
        checks = scraper(core, client)
        route.mock(side_effect=httpx.ReadTimeout("slow"))
        await checks.check_health(a)
        assert a.healthy and a.last_error == "/health failed: ReadTimeout: slow"
        await checks.check_health(a)
        assert not a.healthy
        route.mock(return_value=httpx.Response(200))
        await checks.check_health(a)
        assert a.healthy
        route.mock(side_effect=httpx.ReadTimeout("slow"))
        await checks.check_health(a)  # the count starts again after a pass
        assert a.healthy
        assert backend(core, "b").healthy  # counted per backend


@respx.mock
async def test_the_checks_taking_a_backend_out_free_its_requests_even_if_a_request_took_it_out_first() -> (
    None
):
    core, clock = make_core()
    a = backend(core, "a")
    waiting = WaitingRequest("r1", "a", clock.now())
    core.live.add(waiting)
    core.health.failed_before_answer(a, "connect", "refused")
    assert not a.healthy and a.last_error == "refused" and waiting.freed == []
    respx.get("http://a.test/health").respond(503)
    async with httpx.AsyncClient() as client:
        checks = scraper(core, client)
        await checks.check_health(a)
        assert waiting.freed == []
        await checks.check_health(a)
        assert waiting.freed == [FOUND_DOWN]
        await checks.check_health(a)  # said once, at the threshold
        assert waiting.freed == [FOUND_DOWN]
    assert not a.healthy and a.last_error == "/health answered 503"


@respx.mock
async def test_a_backend_removed_and_added_again_counts_its_failed_checks_from_none() -> None:
    core, _ = make_core()
    respx.get("http://a.test/health").respond(503)
    async with httpx.AsyncClient() as client:
        checks = scraper(core, client)
        await checks.check_health(backend(core, "a"))
        spec = backend(core, "a").spec
        core.fleet.remove("a")
        again = core.fleet.add(spec)
        await checks.check_health(again)
        assert again.healthy  # its first failure, not its second


def test_a_stream_broken_after_output_takes_its_backend_out_once() -> None:
    core, _ = make_core()
    a = backend(core, "a")
    core.health.failed_mid_stream(a, "mid_stream", "reset")
    assert not a.healthy and a.last_error == "mid_stream: reset"
    core.health.failed_mid_stream(a, "mid_stream", "reset")
    sample = core.prom.get_sample_value(
        "fleet_proxy_passive_ejections_total", {"backend": "a", "reason": "mid_stream"}
    )
    assert sample == 1.0


def test_failures_in_a_row_eject_a_backend_until_the_clock_passes_the_ejection() -> None:
    core, clock = make_core()
    a = backend(core, "a")
    core.health.failed_before_answer(a, "status", "500")
    assert ejected_until(core, "a") == 0.0 and core.health.ejection_state("a") is None
    core.health.failed_before_answer(a, "status", "500")
    assert ejected_until(core, "a") == clock.now() + EJECTION_S
    state = core.health.ejection_state("a")
    assert state is not None and state.until == ejected_until(core, "a")
    assert a.healthy  # ejected, not unhealthy: its health checks still pass
    clock.advance(EJECTION_S / 2)
    core.health.tick()
    assert ejected_until(core, "a") > clock.now()
    clock.advance(EJECTION_S)
    core.health.tick()
    assert ejected_until(core, "a") == 0.0 and core.health.ejection_state("a") is None


def test_a_success_between_failures_keeps_a_backend_in() -> None:
    core, _ = make_core()
    a = backend(core, "a")
    core.health.failed_before_answer(a, "status", "500")
    core.health.succeeded(a)
    core.health.failed_before_answer(a, "status", "500")
    assert ejected_until(core, "a") == 0.0


def test_a_stalled_backend_is_ejected_and_its_waiting_requests_leave_it() -> None:
    core, clock = make_core()
    stuck = WaitingRequest("r1", "a", clock.now())
    core.live.add(stuck)
    clock.advance(STALL_S / 2)
    core.health.tick()
    assert stuck.freed == [] and ejected_until(core, "a") == 0.0  # not waiting long enough
    recent = WaitingRequest("r2", "b", clock.now())
    core.live.add(recent)
    clock.advance(STALL_S)
    core.health.tick()
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
    core.health.tick()
    assert first.freed == ["its backend stalled"]
    until = ejected_until(core, "a")
    # Written to `a` after that sweep: it was connecting while the others were freed.
    late = WaitingRequest("r2", "a", clock.now())
    core.live.add(late)
    clock.advance(STALL_S / 2)
    core.health.tick()
    assert late.freed == []  # not waiting long enough yet to tell
    clock.advance(STALL_S)
    core.health.tick()
    assert late.freed == ["its backend stalled"]
    assert ejected_until(core, "a") == until  # the ejection is not renewed by it
