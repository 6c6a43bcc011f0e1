"""The real proxy in front of simulated engines, served from a background thread's event loop.

Hypothesis and schemathesis drive synchronous test functions; running the servers in their own
thread lets those functions use blocking clients (raw sockets, requests) with timeouts while
the proxy keeps serving. Everything listens on 127.0.0.1 ports chosen by the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, settings

from proxy.serving.app import FleetProxyApp
from simulator.fleet import DEFAULT_MODEL, start_fleet
from simulator.profiles import DEFAULT_PROFILE, load_profile
from tests.support.servers import fast_settings, running_proxy

MODEL = DEFAULT_MODEL
# Bounds every wait on the servers: a fuzz example that takes longer is a hang.
STARTUP_S = 30.0
REQUEST_TIMEOUT_S = 10.0
MAX_MODEL_LEN = 256

T = TypeVar("T")


def fuzz_settings(max_examples: int) -> settings:
    """Bounded, no example database (nothing written to disk), and the same examples every run
    where CI is set, so a CI failure reproduces. FLEET_FUZZ_SCALE multiplies the examples for
    a longer hunt by hand."""
    scale = float(os.environ.get("FLEET_FUZZ_SCALE", "1"))
    return settings(
        max_examples=max(1, int(max_examples * scale)),
        deadline=None,
        database=None,
        derandomize=bool(os.environ.get("CI")),
        print_blob=True,
        # Shrinking stays (a small failing example is worth its time); explaining re-runs
        # each failing example hundreds of times against the servers.
        phases=[p for p in Phase if p is not Phase.explain],
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


@dataclass
class LiveProxy:
    url: str
    host: str
    port: int
    app: FleetProxyApp
    sim_urls: list[str]
    loop: asyncio.AbstractEventLoop
    _stop: asyncio.Event = field(repr=False)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = REQUEST_TIMEOUT_S) -> T:
        """Run `coro` on the servers' loop (to read the proxy's state safely)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextlib.contextmanager
def live_proxy(engines: int = 1, **extra: Any) -> Iterator[LiveProxy]:
    """Simulated engines and the proxy in front of them, until the block ends; `extra` are
    proxy settings."""
    started: list[LiveProxy] = []
    failed: list[BaseException] = []
    ready = threading.Event()

    async def serve() -> None:
        stop = asyncio.Event()
        try:
            # Fast engines with a short context: a request without an output limit still ends
            # within milliseconds.
            profile = load_profile(DEFAULT_PROFILE).with_overrides(max_model_len=MAX_MODEL_LEN)
            async with await start_fleet(engines, profile=profile, speed=50.0) as fleet:
                settings = fast_settings(fleet.urls, **extra)
                async with running_proxy(settings) as (url, app):
                    host, port = url.removeprefix("http://").rsplit(":", 1)
                    loop = asyncio.get_running_loop()
                    started.append(LiveProxy(url, host, int(port), app, fleet.urls, loop, stop))
                    ready.set()
                    await stop.wait()
        except BaseException as e:
            failed.append(e)
            raise
        finally:
            ready.set()

    # A daemon: should it ever hang, the test run still ends (and the join below fails it).
    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="fuzz-proxy", daemon=True)
    thread.start()
    try:
        if not ready.wait(STARTUP_S) or not started:
            raise RuntimeError(f"the proxy did not start: {failed[:1]!r}")
        live = started[0]
        yield live
    finally:
        if started:
            started[0].loop.call_soon_threadsafe(started[0]._stop.set)
        thread.join(STARTUP_S)
        if thread.is_alive():
            raise RuntimeError("the proxy's thread did not stop")
