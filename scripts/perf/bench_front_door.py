"""CPU per request of the proxy's HTTP protocol (proxy/serving/front_door_protocol.py) beside
uvicorn's own httptools protocol it extends, without sockets or a load generator in the way.

One keep-alive connection on a transport that discards what it is given, a request that
arrives in one read, an ASGI app that answers at once: what is left is the protocol's own
work (parse, cycle, task, response). With --fresh-connections each request has a connection
of its own (opened, the request, closed), which adds the per-connection work. Rounds
alternate the two classes; medians are printed.

    python scripts/perf/bench_front_door.py [--requests 30000] [--rounds 7] [--fresh-connections]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.serving.front_door_protocol import FrontDoorLimits, front_door_protocol
from proxy.serving.refusal_stats import FrontDoorStats
from proxy.settings import load_settings

REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: wrk\r\n"
    b"Content-Type: application/json\r\nContent-Length: 80\r\n\r\n" + b"x" * 80
)


class NullTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self._closing = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def per_request_us(
    protocol: type[asyncio.Protocol], requests: int, fresh_connections: bool = False
) -> float:
    answered = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})
        answered.set()

    config = Config(app, http=protocol, lifespan="off", log_level="warning")
    config.load()
    state = ServerState()

    def connect() -> Any:
        conn = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=state, app_state={}
        )
        conn.connection_made(NullTransport())
        return conn

    conn = connect()
    started = time.process_time()
    for _ in range(requests):
        if fresh_connections:
            conn.connection_lost(None)
            conn = connect()
        answered.clear()
        conn.data_received(REQUEST)
        await answered.wait()
    elapsed = time.process_time() - started
    conn.connection_lost(None)
    return 1e6 * elapsed / requests


async def run(requests: int, rounds: int, fresh_connections: bool) -> None:
    front_door = front_door_protocol(
        FrontDoorLimits.from_settings(load_settings()), FrontDoorStats(None)
    )
    classes: dict[str, type[asyncio.Protocol]] = {
        "uvicorn httptools": HttpToolsProtocol,
        "front door": front_door,
    }
    times: dict[str, list[float]] = {name: [] for name in classes}
    gc.disable()
    for _ in range(rounds):
        for name, cls in classes.items():
            times[name].append(await per_request_us(cls, requests, fresh_connections))
    for name, values in times.items():
        print(
            f"{name:>17}: median {statistics.median(values):.2f} us/request "
            f"(min {min(values):.2f}, max {max(values):.2f})"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=30000, help="requests per round and class")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument(
        "--fresh-connections", action="store_true", help="a connection of its own per request"
    )
    args = p.parse_args()
    uvloop.run(run(args.requests, args.rounds, args.fresh_connections))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
