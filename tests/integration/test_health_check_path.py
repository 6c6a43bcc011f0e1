"""The backends' health check path, on a backend whose /health fails and whose other path
answers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from tests.support.fake_backend import Behaviour, FakeBackend
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy


class GatewayBackend(FakeBackend):
    """Healthy on /gateway/ok only (its /health answers 503); counts the checks of each."""

    def __init__(self, behaviour: Behaviour) -> None:
        super().__init__(behaviour=behaviour)
        self.checks: dict[str, int] = {"/health": 0, "/gateway/ok": 0}

    def _routes(self, app: web.Application) -> None:
        app.middlewares.append(self._count)
        super()._routes(app)
        app.router.add_get("/gateway/ok", self._ok)

    @web.middleware
    async def _count(self, request: web.Request, handler: object) -> web.StreamResponse:
        if request.path in self.checks:
            self.checks[request.path] += 1
        assert callable(handler)
        response: web.StreamResponse = await handler(request)
        return response

    async def _ok(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")


@pytest.fixture
async def backend() -> AsyncIterator[GatewayBackend]:
    b = GatewayBackend(behaviour=Behaviour(healthy=False))
    await b.start()
    yield b
    await b.stop()


async def test_the_configured_path_is_the_health_check(backend):
    settings = fast_settings([backend.url], health_check_path="/gateway/ok")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
        assert r.status_code == 200
    assert backend.checks["/gateway/ok"] > 0
    assert backend.checks["/health"] == 0


async def test_by_default_health_is_checked_on_slash_health(backend):
    async with running_proxy(fast_settings([backend.url]), wait_ready=False) as (url, app):
        await eventually(lambda: backend.checks["/health"] >= 3, what="three health checks")
        async with httpx.AsyncClient(base_url=url) as c:
            assert (await c.get("/ready")).status_code == 503
        [b] = list(app.core.fleet)
        assert not b.healthy
        assert b.last_error == "/health answered 503"
    assert backend.checks["/gateway/ok"] == 0


def test_the_path_must_be_a_path() -> None:
    from proxy.settings import ConfigError, load_settings

    for bad in ("health", "/he alth", ""):
        with pytest.raises(ConfigError, match="health_check_path"):
            load_settings({"health_check_path": bad})
