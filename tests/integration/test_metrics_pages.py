"""Backends' /metrics pages read over the proxy's own HTTP client, against raw asyncio servers on
127.0.0.1 that write exact bytes, the scraper taking its snapshots through it, and a started
proxy doing so."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from fleet.clock import FakeClock
from fleet.registry import FleetRegistry
from fleet.scrape import PageUnavailable, Scraper
from fleet.types import Backend, BackendSpec
from proxy.backends.metrics_pages import PooledMetricsPages
from proxy.backends.upstream import UpstreamPool
from proxy.serving.wiring import ProxyCore
from proxy.settings import load_settings
from tests.support.polling import eventually

PAGE = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 5\n'

Answer = Callable[[bytes], Awaitable[bytes | None]]  # request head -> bytes to write, or hang


class PageServer:
    """Answers each request on a connection with `answer(head)`; records heads and counts
    connections, and whether each ended (the client closed it)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        self.accepted = 0
        self.closed_by_client = 0
        self.origin = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> PageServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.origin = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client += 1
                    return
                self.heads.append(head)
                answer = await self.answer(head)
                if answer is None:  # hang until the client goes away
                    await reader.read()
                    self.closed_by_client += 1
                    return
                writer.write(answer)
                await writer.drain()
        except ConnectionError:
            self.closed_by_client += 1
        finally:
            writer.close()
            self._tasks.discard(task)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def response(status: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


async def page(head: bytes) -> bytes:
    return response(b"200 OK", PAGE)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[PageServer]]]:
    servers: list[PageServer] = []

    async def start(answer: Answer) -> PageServer:
        servers.append(await PageServer(answer).start())
        return servers[-1]

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    p = UpstreamPool(
        connect_timeout=2.0, read_timeout=30.0, fixed_headers=[(b"authorization", b"Bearer k")]
    )
    yield p
    await p.close()


async def test_pages_are_read_on_one_kept_alive_connection_with_the_backends_key(
    serve: Callable[[Answer], Awaitable[PageServer]], pool: UpstreamPool
) -> None:
    server = await serve(page)
    pages = PooledMetricsPages(pool, timeout=5.0)
    for _ in range(3):
        assert await pages.metrics_page(server.origin + "/engine/metrics") == PAGE.decode()
    assert server.accepted == 1
    head = server.heads[0]
    assert head.startswith(b"GET /engine/metrics HTTP/1.1\r\n")
    assert b"\r\nauthorization: Bearer k\r\n" in head
    assert b"content-length" not in head.lower()  # a GET without a body says nothing of one


async def test_an_answer_other_than_200_is_unavailable(
    serve: Callable[[Answer], Awaitable[PageServer]], pool: UpstreamPool
) -> None:
    async def error(head: bytes) -> bytes:
        return response(b"503 Service Unavailable", b"busy")

    server = await serve(error)
    with pytest.raises(PageUnavailable, match="answered 503"):
        await PooledMetricsPages(pool, timeout=5.0).metrics_page(server.origin + "/metrics")


async def test_a_page_not_answered_in_time_is_unavailable_and_its_connection_closed(
    serve: Callable[[Answer], Awaitable[PageServer]], pool: UpstreamPool
) -> None:
    hang = True

    async def answer(head: bytes) -> bytes | None:
        return None if hang else response(b"200 OK", PAGE)

    server = await serve(answer)
    pages = PooledMetricsPages(pool, timeout=0.2)
    with pytest.raises(PageUnavailable, match=r"no answer within 0\.2 s"):
        await pages.metrics_page(server.origin + "/metrics")
    # The half-answered connection is closed, not put back for the next request.
    await eventually(lambda: server.closed_by_client == 1, within=10, what="connection closed")
    hang = False
    assert await pages.metrics_page(server.origin + "/metrics") == PAGE.decode()
    assert server.accepted == 2


async def test_a_refused_connection_is_unavailable(pool: UpstreamPool) -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    with pytest.raises(PageUnavailable, match="connect"):
        await PooledMetricsPages(pool, timeout=5.0).metrics_page(f"http://127.0.0.1:{port}/metrics")


class NoHealth:
    def check_passed(self, backend: Backend) -> None:
        pass

    def check_failed(self, backend: Backend, detail: str) -> None:
        pass


async def test_the_scraper_takes_its_snapshots_through_the_pool(
    serve: Callable[[Answer], Awaitable[PageServer]], pool: UpstreamPool
) -> None:
    broken = False

    async def answer(head: bytes) -> bytes:
        return response(b"500 Internal Server Error", b"") if broken else response(b"200 OK", PAGE)

    server = await serve(answer)
    fleet = FleetRegistry(stale_after=1.0)
    fleet.add(BackendSpec(id="a", url=server.origin))
    backend = fleet.get("a")
    assert backend is not None
    async with httpx.AsyncClient() as client:
        scraper = Scraper(
            fleet, client, FakeClock(), health=NoHealth(), pages=PooledMetricsPages(pool, 5.0)
        )
        await scraper.scrape_metrics(backend)
        assert backend.snapshot is not None and backend.snapshot.metrics.running == 5
        taken = backend.snapshot
        broken = True
        await scraper.scrape_metrics(backend)
    assert backend.snapshot is taken  # kept, to go stale on its own
    assert backend.last_error == "/metrics failed: answered 500"


async def test_a_started_proxy_scrapes_over_its_pool_and_checks_health_over_httpx(
    serve: Callable[[Answer], Awaitable[PageServer]],
) -> None:
    async def answer(head: bytes) -> bytes:
        if head.startswith(b"GET /v1/models "):
            return response(b"200 OK", b'{"data": [{"id": "m"}]}')
        return response(b"200 OK", PAGE if head.startswith(b"GET /metrics ") else b"")

    server = await serve(answer)
    core = ProxyCore(load_settings({"backends": [server.origin]}), FakeClock())
    await core.start()
    try:

        def scraped() -> bool:
            return any(h.startswith(b"GET /metrics ") for h in server.heads)

        await eventually(scraped, within=30, what="a /metrics scrape")
        # Not over the forwarding pool: a forwarded request never finds a scrape's connection.
        pool = core.upstream_pool()
        assert isinstance(pool, UpstreamPool) and pool.origins() == []
    finally:
        await core.stop()
    by_path = {h.split(b" ")[1]: h.lower() for h in server.heads}
    assert b"user-agent: python-httpx" in by_path[b"/health"]
    assert b"user-agent" not in by_path[b"/metrics"]  # the pool sends none
