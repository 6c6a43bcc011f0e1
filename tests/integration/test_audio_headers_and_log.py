"""Audio uploads follow the chat path's header and logging rules: the headers a client's
`Connection:` names stay on its hop, and each upload has its line in the request log. Real
sockets, a fake engine (`backend`) that keeps the headers it received."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson

from tests.support.fake_backend import FakeBackend
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

FORM = {"model": "fake-model"}
FILES = {"file": ("speech.wav", b"\x01" * 4096, "audio/wav")}


async def test_headers_named_in_connection_stay_on_the_clients_hop(backend: FakeBackend) -> None:
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        headers = {"connection": "keep-alive, X-Hop-Secret", "x-hop-secret": "1", "x-end": "2"}
        r = await c.post("/v1/audio/transcriptions", data=FORM, files=FILES, headers=headers)
        assert r.status_code == 200, r.text
        (seen,) = backend.seen
        assert seen.path == "/v1/audio/transcriptions" and seen.body["size"] > 4096
        assert "x-hop-secret" not in seen.headers
        assert seen.headers["x-end"] == "2"


async def test_an_upload_has_its_line_in_the_request_log(
    backend: FakeBackend, tmp_path: Path
) -> None:
    path = tmp_path / "requests.jsonl"
    settings = fast_settings([backend.url], request_log="json", request_log_file=path)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        ok = await c.post(
            "/v1/audio/transcriptions", data=FORM, files=FILES, headers={"x-request-id": "a-1"}
        )
        assert ok.status_code == 200, ok.text
        refused = await c.post("/v1/audio/transcriptions", files=FILES)  # no model
        assert refused.status_code == 400

        def two_lines() -> list[bytes] | None:
            got = path.read_bytes().splitlines() if path.exists() else []
            return got if len(got) >= 2 else None

        lines = [orjson.loads(x) for x in await eventually(two_lines, what="two log lines")]
    by_status = {line["status"]: line for line in lines}
    line = by_status[200]
    assert line["request_id"] == "a-1" and line["endpoint"] == "audio/transcriptions"
    assert line["model"] == "fake-model" and line["stream"] is False
    assert line["backends"] == [backend.url.removeprefix("http://")] and line["attempts"] == 1
    assert line["e2e_ms"] > 0 and line["client_disconnect"] is False
    bad = by_status[400]
    assert bad["endpoint"] == "audio/transcriptions" and bad["model"] is None
    assert bad["backends"] == []
