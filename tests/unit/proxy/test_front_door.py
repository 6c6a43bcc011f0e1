"""The front door's pieces that need no socket: its settings, uvicorn configuration, error
responses, refusal reports and the open-file limit. tests/integration/test_front_door.py
probes the server itself."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from uvicorn.config import Config
from uvicorn.server import ServerState

from proxy.metrics import RouterMetrics
from proxy.serving import front_door
from proxy.serving.app import create_app
from proxy.serving.front_door import FD_RESERVE, fit_open_files, uvicorn_config
from proxy.serving.front_door_protocol import FrontDoorLimits, error_response, front_door_protocol
from proxy.serving.refusal_stats import REASONS, FrontDoorStats
from proxy.settings import ConfigError, load_settings


def test_defaults_and_bounds() -> None:
    limits = FrontDoorLimits.from_settings(load_settings())
    assert limits == FrontDoorLimits(
        max_connections=8192,
        max_header_count=100,
        max_header_bytes=65536,
        max_body_bytes=10 * 1024 * 1024,
        header_timeout=10.0,
        body_timeout=30.0,
        keep_alive_timeout=60.0,
        address_share=0.5,
    )
    for bad in (
        {"client_max_connections": 0},
        {"client_address_share": 0},
        {"client_address_share": 1.5},
        {"client_max_header_count": 0},
        {"client_max_header_bytes": 100},
        {"client_header_timeout": 0},
        {"client_body_timeout": float("inf")},
        {"client_keep_alive_timeout": -1},
    ):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            load_settings(bad)


def test_env_sets_a_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_PROXY_CLIENT_HEADER_TIMEOUT", "2.5")
    assert load_settings().client_header_timeout == 2.5


def test_uvicorn_config_serves_with_the_front_door_protocol() -> None:
    settings = load_settings({"client_keep_alive_timeout": 1.5, "port": 9123})
    config = uvicorn_config(create_app(settings), settings, loop="none")
    assert config.port == 9123 and config.loop == "none"
    config.load()
    assert config.http_protocol_class.__name__ == "FrontDoorProtocol"
    assert config.ws == "none"
    assert not config.proxy_headers and not config.server_header


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )


async def test_each_server_holds_its_connections_to_its_own_limits() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    defaults = FrontDoorLimits.from_settings(load_settings())
    strict = front_door_protocol(replace(defaults, max_header_bytes=1024), FrontDoorStats(None))
    lenient = front_door_protocol(defaults, FrontDoorStats(None))
    request = b"GET /health HTTP/1.1\r\nhost: a\r\nx-pad: " + b"p" * 2000 + b"\r\n\r\n"
    answers = []
    for protocol in (strict, lenient):
        config = Config(app, http=protocol, lifespan="off", log_level="warning")
        config.load()
        connection = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=ServerState(), app_state={}
        )
        transport = RecordingTransport()
        connection.connection_made(transport)
        connection.data_received(request)
        for _ in range(100):  # the app's task answers on a later turn of the loop
            if transport.written:
                break
            await asyncio.sleep(0)
        connection.connection_lost(None)
        answers.append(transport.written.split(b"\r\n", 1)[0])
    assert answers == [b"HTTP/1.1 431 Request Header Fields Too Large", b"HTTP/1.1 200 OK"]


def test_error_response_is_whole_and_openai_shaped() -> None:
    raw = error_response(
        503,
        "busy",
        type="service_unavailable",
        default_headers=[(b"date", b"today")],
        extra_headers=[(b"retry-after", b"1")],
    )
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 503 Service Unavailable"
    assert set(lines[1:]) == {
        b"date: today",
        b"retry-after: 1",
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    }
    assert json.loads(body) == {
        "error": {"message": "busy", "type": "service_unavailable", "param": None, "code": 503}
    }


def test_refusals_are_counted_and_reported_at_most_every_10_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    registry = CollectorRegistry()
    stats = FrontDoorStats(RouterMetrics(registry), clock=lambda: now[0])
    stats.connections = {object(), object()}
    for reason in REASONS:
        assert (
            registry.get_sample_value(
                "fleet_proxy_client_connections_refused_total", {"reason": reason}
            )
            == 0
        )
    with caplog.at_level(logging.WARNING, logger="fleet_proxy.front_door"):
        stats.refused("connection_limit")  # the first is reported at once
        for _ in range(5):
            now[0] += 1.0
            stats.refused("connection_limit")
        stats.refused("header_timeout", "open 10.0 s, 0 request head(s) before")
        now[0] += 5.0  # 11 s after the first report
        stats.refused("connection_limit")
        now[0] += 11.0
        stats.refused("connection_limit")  # the detail went with the report before
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "refused 1 client connection(s) since the last report (connection_limit 1); 2 open",
        "refused 7 client connection(s) since the last report "
        "(connection_limit 6, header_timeout 1); 2 open; "
        "last header_timeout: open 10.0 s, 0 request head(s) before",
        "refused 1 client connection(s) since the last report (connection_limit 1); 2 open",
    ]
    assert (
        registry.get_sample_value(
            "fleet_proxy_client_connections_refused_total", {"reason": "connection_limit"}
        )
        == 8
    )
    assert registry.get_sample_value("fleet_proxy_client_connections") == 2


class FakeLimits:
    def __init__(self, soft: int, hard: int, *, refuse: bool = False) -> None:
        self.soft, self.hard, self.refuse = soft, hard, refuse

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        if self.refuse:
            raise ValueError("not allowed")
        self.soft, self.hard = limits


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> FakeLimits:
    fake = FakeLimits(1024, 1048576)
    monkeypatch.setattr(front_door.resource, "getrlimit", fake.getrlimit)
    monkeypatch.setattr(front_door.resource, "setrlimit", fake.setrlimit)
    return fake


def test_soft_open_file_limit_is_raised_to_fit(limits: FakeLimits, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fleet_proxy.front_door"):
        assert fit_open_files(8192) == 2 * 8192 + FD_RESERVE
    assert (limits.soft, limits.hard) == (2 * 8192 + FD_RESERVE, 1048576)
    assert caplog.records == []


def test_a_high_enough_soft_limit_is_left_alone(limits: FakeLimits) -> None:
    limits.soft = 100000
    assert fit_open_files(8192) == 100000
    assert limits.soft == 100000


def test_a_cap_past_the_hard_limit_is_warned_about(limits: FakeLimits, caplog) -> None:
    limits.hard = 4096
    with caplog.at_level(logging.WARNING, logger="fleet_proxy.front_door"):
        assert fit_open_files(8192) == 4096
    assert limits.soft == 4096
    [record] = caplog.records
    assert "open-file limit 4096" in record.getMessage()
    assert "client_max_connections=8192" in record.getMessage()


def test_a_refused_raise_is_warned_about(limits: FakeLimits, caplog) -> None:
    limits.refuse = True
    with caplog.at_level(logging.WARNING, logger="fleet_proxy.front_door"):
        assert fit_open_files(8192) == 1024
    assert len(caplog.records) == 2
    assert "cannot raise the open-file limit" in caplog.records[0].getMessage()
