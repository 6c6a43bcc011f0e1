"""The client-facing HTTP server: its uvicorn configuration, a bounded graceful stop, and the
open-file limit its connections need (docs/reliability.md).

Each connection is served by `FrontDoorProtocol` (proxy/serving/front_door_protocol.py), which
holds every client to the limits on headers, bodies, time and open connections.

`uvicorn_config` is the one serving configuration: `fleet-proxy serve`, each worker process
(proxy/serving/workers.py) and the tests' real proxy (tests/support/servers.py) all use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import uvicorn
from uvicorn.config import Config

from fleet.clock import to_next_beat
from proxy.serving.front_door_protocol import FrontDoorLimits, front_door_protocol
from proxy.serving.refusal_stats import FrontDoorStats
from proxy.settings import Settings

if TYPE_CHECKING:
    from proxy.asgi import AsgiApp
    from proxy.metrics import RouterMetrics


class ServedApp(Protocol):
    """What the front door needs of the app it serves: the ASGI callable to run, and the
    metrics its refusals are counted in."""

    @property
    def asgi(self) -> AsgiApp: ...
    @property
    def metrics(self) -> RouterMetrics: ...


log = logging.getLogger("fleet_proxy.front_door")

# The listen() queue of the proxy's sockets (proxy/serving/workers.py binds its own with it too).
BACKLOG = 4096
# Seconds after the shutdown grace period at which uvicorn cancels request tasks still
# running (GracefulServer has closed their connections by then; they end within ~50 ms).
SHUTDOWN_BACKSTOP_S = 5.0
# File descriptors a serving process needs besides one per client connection and one per
# upstream request (at most one per client connection): listening sockets, backend scrapes
# and health checks, idle upstream keep-alive connections, logs, shared memory.
FD_RESERVE = 1024


def uvicorn_config(app: ServedApp, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The proxy's serving configuration; `overrides` replace any of its uvicorn.Config
    arguments (the tests' port 0 and `loop="none"`)."""
    stats = FrontDoorStats(app.metrics)
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "http": front_door_protocol(FrontDoorLimits.from_settings(settings), stats),
        # The proxy serves no WebSocket routes: an Upgrade request is served as plain HTTP.
        "ws": "none",
        "access_log": False,
        "log_level": settings.log_level,
        "backlog": BACKLOG,
        # The proxy does not use the client address, so X-Forwarded-* parsing is wasted work
        # on every request; and it does not advertise its server software.
        "proxy_headers": False,
        "server_header": False,
        # GracefulServer ends what is left at the grace period; this is uvicorn's last resort.
        "timeout_graceful_shutdown": settings.shutdown_grace_period + SHUTDOWN_BACKSTOP_S,
    }
    options.update(overrides)
    return uvicorn.Config(app.asgi, **options)


class GraceDeadline(Protocol):
    """What the server tells the app when a stop's grace period is over."""

    def end_grace(self) -> None:
        """The requests still running are about to lose their connections."""


class GracefulServer(uvicorn.Server):
    """uvicorn's server with a bounded graceful stop. On SIGTERM or SIGINT uvicorn closes the
    listening sockets (new connections are refused), closes idle keep-alive connections and
    marks busy ones to close after their response; requests in flight and streams finish.
    After `grace` seconds this server closes every connection still open: each client sees
    its connection close (a stream stops short of its end, never a false end), and each
    request, seeing its client gone, closes its upstream request (the backend aborts it).

    uvicorn's own `timeout_graceful_shutdown` would instead cancel the request tasks, which
    leaves an error and a traceback per request in the log; it stays as a backstop,
    `SHUTDOWN_BACKSTOP_S` later."""

    # uvicorn's main loop wakes 10 times a second to refresh the Date header (once a second)
    # and look at `should_exit`; in an idle worker those wake-ups cost more CPU than anything
    # else it does. This one wakes once a second, on the process's idle beat, and at once
    # when `should_exit` is set (by a signal, or by another thread).
    TICK_S = 1.0

    def __init__(self, config: Config, grace: float, app: GraceDeadline | None = None) -> None:
        self._tick_loop: asyncio.AbstractEventLoop | None = None
        self._exit_set = asyncio.Event()
        self._should_exit = False
        super().__init__(config)
        self._grace = grace
        self._app = app

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        loop = self._tick_loop
        if value and loop is not None:
            # Thread-safe, and safe from a signal handler: wakes the main loop's wait.
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(self._exit_set.set)

    async def main_loop(self) -> None:
        loop = asyncio.get_running_loop()
        self._tick_loop = loop
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(to_next_beat(loop.time(), self.TICK_S)):
                    await self._exit_set.wait()
            self._exit_set.clear()
            counter = (counter + 10) % 864000  # uvicorn refreshes the Date at multiples of 10
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        deadline = asyncio.get_running_loop().call_later(self._grace, self._close_what_is_left)
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()

    def _close_what_is_left(self) -> None:
        connections = list(self.server_state.connections)
        if not connections:
            return
        log.warning(
            "shutdown grace period of %g s over: closing %d connection(s) still open",
            self._grace,
            len(connections),
        )
        if self._app is not None:
            self._app.end_grace()
        for connection in connections:
            transport = connection.transport
            if not transport.is_closing():
                transport.close()


class AnnouncingServer(GracefulServer):
    """A uvicorn server that calls `on_listening(port)` once its socket is bound and the app
    has started: what is announced then accepts connections, on the port really bound (the
    one the kernel chose for port 0)."""

    def __init__(
        self,
        config: Config,
        on_listening: Callable[[int], None],
        grace: float,
        app: GraceDeadline | None = None,
    ) -> None:
        super().__init__(config, grace, app)
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_listening(int(self.servers[0].sockets[0].getsockname()[1]))


def fit_open_files(max_connections: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE (up to the hard limit) so that
    `max_connections` client connections fit, each with an upstream request, plus
    FD_RESERVE; warn when they still cannot. Returns the soft limit now in force."""
    want = 2 * max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, e)
    if soft < want:
        log.warning(
            "open-file limit %d (hard limit %d) is below the %d that client_max_connections=%d "
            "needs (a client connection and its upstream request each, plus %d): past it "
            "connections fail without an answer; raise `ulimit -n` or lower "
            "client_max_connections",
            soft,
            hard,
            want,
            max_connections,
            FD_RESERVE,
        )
    return soft
