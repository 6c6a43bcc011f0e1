"""The composition root's forwarding client: a stand-in given to `ProxyCore` is the one its
requests use and its stop closes; without one, start builds the real pool."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from fleet.clock import FakeClock
from proxy.backends.upstream import UpstreamPool, UpstreamResponse
from proxy.serving.wiring import ProxyCore
from proxy.settings import load_settings

ORIGIN = "http://127.0.0.1:9"


class StandIn:
    def __init__(self) -> None:
        self.closed = False

    async def request(
        self,
        origin: str,
        path: str | bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        method: bytes = b"POST",
        on_sent: Callable[[UpstreamResponse], None] | None = None,
    ) -> UpstreamResponse:
        raise AssertionError("not asked here")

    def retain_origins(self, keep: set[str]) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


async def test_start_uses_the_given_upstream_and_stop_closes_it() -> None:
    fake = StandIn()
    core = ProxyCore(load_settings({"backends": [ORIGIN]}), FakeClock(), upstream=fake)
    await core.start()
    try:
        assert core.upstream_pool() is fake
    finally:
        await core.stop()
    assert fake.closed


async def test_without_one_start_builds_its_own_pool() -> None:
    core = ProxyCore(load_settings({"backends": [ORIGIN]}), FakeClock())
    with pytest.raises(RuntimeError):
        core.upstream_pool()
    await core.start()
    try:
        assert isinstance(core.upstream_pool(), UpstreamPool)
    finally:
        await core.stop()
