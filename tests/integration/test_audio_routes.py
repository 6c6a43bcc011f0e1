"""The audio routes through the proxy on simulated engines: the official openai SDK's
transcriptions and translations (whole, text and streamed), a 20 MB upload streamed through
in bounded memory, the body cap (declared and chunked) and an unknown model."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from simulator.fleet import SimFleet, start_fleet
from tests.support.polling import eventually
from tests.support.proxy_metrics import body_bytes_in_flight as in_flight
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
MIB = 1024 * 1024


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(2, speed=10.0) as f:
        yield f


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def audio(size: int) -> tuple[str, io.BytesIO, str]:
    return ("speech.wav", io.BytesIO(b"\x01" * size), "audio/wav")


async def test_the_openai_sdk_transcribes_and_translates_through_the_proxy(
    fleet: SimFleet,
) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        client = sdk(url)
        t = await client.audio.transcriptions.create(file=audio(64_000), model=MODEL)
        assert t.text == "simulated transcribed audio of 64000 bytes"
        usage: Any = t.usage
        assert usage is not None and usage.type == "duration" and usage.seconds == 2
        tr = await client.audio.translations.create(file=audio(1000), model=MODEL)
        assert tr.text == "simulated translated audio of 1000 bytes"
        plain = await client.audio.transcriptions.create(
            file=audio(10), model=MODEL, response_format="text"
        )
        assert plain.strip() == "simulated transcribed audio of 10 bytes"
        async with httpx.AsyncClient(base_url=url) as c:
            metrics = (await c.get("/metrics")).text
        for endpoint, n in (("audio/transcriptions", 2), ("audio/translations", 1)):
            series = (
                f'fleet_proxy_requests_total{{endpoint="{endpoint}",model="{MODEL}",status="200"}}'
            )
            assert f"{series} {float(n)}" in metrics, endpoint


async def test_a_streamed_transcription_is_relayed_as_events(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        stream = await sdk(url).audio.transcriptions.create(
            file=audio(3200), model=MODEL, stream=True,
            extra_body={"stream_include_usage": True},
        )  # fmt: skip
        events = [e.model_dump() async for e in stream]
    assert {e["object"] for e in events} == {"transcription.chunk"}
    text = "".join(c["delta"]["content"] for e in events for c in e["choices"])
    assert text == "simulated transcribed audio of 3200 bytes"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["usage"]["completion_tokens"] == 6


def resident_bytes() -> int:
    """This process's resident memory (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def form_parts(model: str, boundary: str) -> tuple[bytes, bytes]:
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    return head, f"\r\n--{boundary}--\r\n".encode()


@pytest.mark.slow
async def test_a_20_mb_upload_streams_through_in_bounded_memory(fleet: SimFleet) -> None:
    """The proxy holds the upload's bytes only until its model is read: the process's
    body-bytes gauge, sampled while the 20 MB go through, stays far below the upload, and so
    does the growth of the resident memory of this process (proxy, engines and client)."""
    settings = fast_settings(fleet.urls, max_body_bytes=32 * MIB)
    size = 20 * 1000 * 1000
    chunk = 256 * 1024
    seen: list[float] = []
    rss = [resident_bytes()]
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        head, tail = form_parts(MODEL, "b0und")

        async def body() -> AsyncIterator[bytes]:
            yield head
            sent = 0
            while sent < size:
                n = min(chunk, size - sent)
                yield b"\x02" * n
                sent += n
                if sent % (16 * chunk) == 0:
                    seen.append(await in_flight(c))
                    rss.append(resident_bytes())
            yield tail

        r = await c.post(
            "/v1/audio/transcriptions",
            content=body(),
            headers={"content-type": "multipart/form-data; boundary=b0und"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["text"] == f"simulated transcribed audio of {size} bytes"
        assert await in_flight(c) == 0
    assert len(seen) >= 4
    # Held at most: the part read before streaming began (audio_replay_bytes) and a chunk.
    assert max(seen) <= settings.audio_replay_bytes + 2 * chunk
    assert max(rss) - rss[0] < size // 2, [r - rss[0] for r in rss]


async def test_a_body_over_the_cap_gets_413_declared_or_chunked(fleet: SimFleet) -> None:
    settings = fast_settings(fleet.urls, max_body_bytes=2 * MIB)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        head, tail = form_parts(MODEL, "b0und")
        whole = head + b"\x03" * (3 * MIB) + tail
        headers = {"content-type": "multipart/form-data; boundary=b0und"}
        r = await c.post("/v1/audio/transcriptions", content=whole, headers=headers)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == 413

        async def chunked() -> AsyncIterator[bytes]:
            for i in range(0, len(whole), 64 * 1024):
                yield whole[i : i + 64 * 1024]

        r = await c.post("/v1/audio/transcriptions", content=chunked(), headers=headers)
        assert r.status_code == 413, r.text
        assert "2097152-byte limit" in r.json()["error"]["message"]
        assert await in_flight(c) == 0


async def test_an_unknown_model_gets_404(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        with pytest.raises(openai.NotFoundError) as e:
            await sdk(url).audio.transcriptions.create(file=audio(100), model="no-such-model")
        assert "no-such-model" in str(e.value)


async def test_a_model_after_the_file_is_found_with_the_body_held(fleet: SimFleet) -> None:
    boundary = "b0und"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + b"\x04" * 200_000
        + (
            f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{MODEL}\r\n'
            f"--{boundary}--\r\n"
        ).encode()
    )
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    settings = fast_settings(fleet.urls)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/audio/transcriptions", content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["text"] == "simulated transcribed audio of 200000 bytes"
        no_model = body.replace(b'name="model"', b'name="lang"')
        r = await c.post("/v1/audio/transcriptions", content=no_model, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"
        r = await c.post("/v1/audio/transcriptions", content=b"{}", headers={})
        assert r.status_code == 400 and "multipart/form-data" in r.text


async def test_a_small_upload_is_retried_and_a_large_one_is_not(fleet: SimFleet) -> None:
    """One engine answers every request 500. A large upload streamed to it gets that answer
    (it cannot be sent again); a small one held whole is tried on the other engine."""
    failing = fleet.engines[0]
    failing.engine.faults.settings.error_rate = 1.0
    failing_id = failing.url.removeprefix("http://")
    settings = fast_settings(fleet.urls, policy="round_robin", audio_replay_bytes=10_000)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        head, tail = form_parts(MODEL, "b0und")
        headers = {"content-type": "multipart/form-data; boundary=b0und"}
        large = head + b"\x05" * (2 * MIB) + tail  # far more than one read of the socket
        answered = []
        for _ in range(4):
            r = await c.post("/v1/audio/transcriptions", content=large, headers=headers)
            answered.append((r.status_code, r.headers["x-fleet-backend"] == failing_id))
        assert sorted(set(answered)) == [(200, False), (500, True)]
        small = head + b"\x05" * 1000 + tail
        for _ in range(4):
            r = await c.post("/v1/audio/transcriptions", content=small, headers=headers)
            assert r.status_code == 200, r.text
            assert r.headers["x-fleet-backend"] != failing_id


async def test_client_keys_and_admission_hold_for_uploads(fleet: SimFleet) -> None:
    settings = fast_settings(
        fleet.urls, api_keys=["k1"], max_concurrent_requests=1, admission_queue_size=0
    )
    async with running_proxy(settings) as (url, app):
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(
                base_url=url + "/v1", api_key="wrong", max_retries=0
            ).audio.transcriptions.create(file=audio(10), model=MODEL)
        keyed = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k1", max_retries=0)
        t = await keyed.audio.transcriptions.create(file=audio(10), model=MODEL)
        assert t.text.endswith("of 10 bytes")

        # One upload in flight takes the only admission slot: another is refused at once.
        release = asyncio.Event()
        head, tail = form_parts(MODEL, "b0und")

        async def slow() -> AsyncIterator[bytes]:
            yield head
            await release.wait()
            yield b"\x06" * 10 + tail

        headers = {
            "content-type": "multipart/form-data; boundary=b0und",
            "authorization": "Bearer k1",
        }
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            first = asyncio.create_task(
                c.post("/v1/audio/transcriptions", content=slow(), headers=headers)
            )

            gate = app.admission
            assert gate is not None
            await eventually(lambda: gate.running == 1, what="the upload admitted")
            r = await c.post("/v1/audio/transcriptions", content=head + tail, headers=headers)
            assert r.status_code == 429, r.text
            release.set()
            assert (await first).status_code == 200
