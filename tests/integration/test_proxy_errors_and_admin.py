"""Bad input, readiness, the admin API and the official OpenAI SDK against the real proxy."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest

from tests.support.fake_backend import Behaviour, FakeBackend
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy


@pytest.mark.parametrize(
    ("path", "content", "status", "param", "fragment"),
    [
        ("/v1/completions", b"{not json", 400, None, "not valid JSON"),
        ("/v1/completions", b"[1, 2]", 400, None, "JSON object"),
        ("/v1/completions", b'{"prompt": "x"}', 400, "model", "model"),
        ("/v1/completions", b'{"model": 5, "prompt": "x"}', 400, "model", "non-empty string"),
        ("/v1/completions", b'{"model": "fake-model"}', 400, "prompt", "'prompt' is required"),
        (
            "/v1/completions",
            b'{"model": "fake-model", "prompt": {"a": 1}}',
            400,
            "prompt",
            "must be",
        ),
        ("/v1/chat/completions", b'{"model": "fake-model"}', 400, "messages", "required"),
        (
            "/v1/chat/completions",
            b'{"model": "fake-model", "messages": "hi"}',
            400,
            "messages",
            "non-empty list",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "fake-model", "messages": [{"content": "x"}]}',
            400,
            "messages[0].role",
            "role",
        ),
        (
            "/v1/completions",
            b'{"model": "fake-model", "prompt": "x", "stream": "yes"}',
            400,
            "stream",
            "boolean",
        ),
        ("/v1/completions", b'{"model": "nope", "prompt": "x"}', 404, "model", "does not exist"),
    ],
)
async def test_bad_input_gets_openai_shaped_4xx(backend, path, content, status, param, fragment):
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        r = await c.post(path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == status
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["param"] == param
        assert fragment in err["message"]
        assert backend.seen == []


@pytest.mark.parametrize(
    ("extra", "settings"),
    [
        # Each makes the proxy write the body out again, which orjson cannot past 254 levels.
        (b'"stream": false', {"assemble_non_streamed": True}),
        (b'"stream": true, "return_token_ids": false', {}),
    ],
)
async def test_a_body_nested_too_deep_is_a_400_not_an_internal_error(backend, extra, settings):
    deep = b"[" * 300 + b"]" * 300
    content = b'{"model": "fake-model", "prompt": "x", "user": ' + deep + b", " + extra + b"}"
    async with (
        running_proxy(fast_settings([backend.url], **settings)) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        r = await c.post("/v1/completions", content=content)
        assert r.status_code == 400, r.text
        assert "nests deeper than" in r.json()["error"]["message"]
        assert backend.seen == []


async def test_unknown_fields_count_under_one_not_movable_label(backend):
    """Field names are the client's to make up: one metric series for all of them."""
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        for name in ("frobnicate", "zzé", "x" * 200):
            body = {"model": "fake-model", "prompt": "x", "stream": True, name: 1}
            assert (await c.post("/v1/completions", json=body)).status_code == 200
        metrics = (await c.get("/metrics")).text
        assert 'fleet_proxy_requests_not_movable_total{reason="unknown_field"} 3.0' in metrics
        assert "frobnicate" not in metrics


async def test_body_over_limit_is_413(backend):
    settings = fast_settings([backend.url], max_body_bytes=1000)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x" * 2000})
        assert r.status_code == 413
        assert "1000-byte limit" in r.json()["error"]["message"]


async def ready_status(c: httpx.AsyncClient, status: int) -> bool:
    return (await c.get("/ready")).status_code == status


async def test_no_healthy_backend_is_503_with_retry_after(backend):
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        backend.behaviour = Behaviour(healthy=False)
        await eventually(lambda: ready_status(c, 503), what="/ready answering 503")
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert (await c.get("/health")).status_code == 200
        # ...and it comes back when its health check passes again.
        backend.behaviour = Behaviour(healthy=True)
        await eventually(lambda: ready_status(c, 200), what="/ready answering 200")
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
        assert r.status_code == 200


async def test_backend_with_stale_scrape_gets_no_requests(backend):
    other = FakeBackend()
    await other.start()
    try:
        settings = fast_settings([backend.url, other.url], stale_after=1.0)
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
            # /metrics of `other` starts failing: its snapshot ages while backend's stays fresh.
            other.metrics_status = 500

            async def other_stale() -> bool:
                views = (await c.get("/admin/backends")).json()
                return [v["routable"] for v in views] == [True, False]

            await eventually(other_stale, what="the failing backend going stale")
            for _ in range(4):
                r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
                assert backend.url.endswith(r.headers["x-fleet-backend"])
            views = (await c.get("/admin/backends")).json()
            assert [v["routable"] for v in views] == [True, False]
            assert "/metrics failed" in views[1]["last_error"]
            other.metrics_status = 200

            async def both_routable() -> bool:
                return all(v["routable"] for v in (await c.get("/admin/backends")).json())

            await eventually(both_routable, what="the backend routable again")
            used = {
                (
                    await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
                ).headers["x-fleet-backend"]
                for _ in range(4)
            }
            assert len(used) == 2
    finally:
        await other.stop()


async def test_admin_lists_adds_drains_and_removes_backends(backend):
    other = FakeBackend()
    await other.start()
    try:
        settings = fast_settings([backend.url], admin_token="s3cret")
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
            assert (await c.get("/admin/backends")).status_code == 401
            # Authorization carries client API keys on /v1: it never carries the admin token.
            bearer = {"authorization": "Bearer s3cret"}
            assert (await c.get("/admin/backends", headers=bearer)).status_code == 401
            auth = {"x-admin-token": "s3cret"}
            listed = (await c.get("/admin/backends", headers=auth)).json()
            assert [b["url"] for b in listed] == [backend.url]
            assert listed[0]["models"] == ["fake-model"]
            assert listed[0]["metrics"]["kv_usage"] == 0.5

            r = await c.post(
                "/admin/backends",
                json={"url": other.url, "id": "b2", "role": "decode", "labels": {"z": "1"}},
                headers=auth,
            )
            assert r.status_code == 201
            dup = await c.post("/admin/backends", json={"url": other.url, "id": "b2"}, headers=auth)
            assert dup.status_code == 409
            bad = await c.post("/admin/backends", json={"url": "ftp://x"}, headers=auth)
            assert bad.status_code == 400

            async def all_routable() -> list[dict[str, Any]] | None:
                views: list[dict[str, Any]] = (await c.get("/admin/backends", headers=auth)).json()
                return views if all(v["routable"] for v in views) else None

            views = await eventually(all_routable, what="every backend routable")
            first_id = views[0]["id"]
            r = await c.post(
                f"/admin/backends/{first_id}/drain", headers={"x-admin-token": "s3cret"}
            )
            assert r.json()["draining"] is True
            for _ in range(4):
                r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
                assert r.headers["x-fleet-backend"] == "b2"
            assert (await c.delete("/admin/backends/b2", headers=auth)).status_code == 200
            assert (await c.delete("/admin/backends/b2", headers=auth)).status_code == 404
            r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
            assert r.status_code == 503  # the only one left is draining
    finally:
        await other.stop()


async def test_debug_header_returns_decision_receipt(backend):
    settings = fast_settings([backend.url], policy="least_requests", debug_receipts=True)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post(
            "/v1/completions",
            json={"model": "fake-model", "prompt": "x"},
            headers={"x-fleet-debug": "1"},
        )
        receipt = json.loads(r.headers["x-fleet-decision"])
        assert receipt["backend"] == r.headers["x-fleet-backend"]
        assert receipt["scores"][receipt["backend"]] == {"in_flight": 0.0}


async def test_metrics_endpoint_has_router_and_backend_series(backend):
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
        text = (await c.get("/metrics")).text
        assert (
            'fleet_proxy_requests_total{endpoint="completions",model="fake-model",status="200"} 1.0'
            in text
        )
        assert "fleet_proxy_backend_in_flight{" in text
        assert "http_requests_total" in text  # the instrumentator, on the control plane


async def test_official_openai_sdk_is_a_drop_in(backend):
    backend.behaviour = Behaviour(chunks=5)
    async with running_proxy(fast_settings([backend.url])) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        models = await client.models.list()
        assert [m.id for m in models.data] == ["fake-model"]
        comp = await client.completions.create(model="fake-model", prompt="hi", max_tokens=5)
        assert comp.choices[0].text == "t0 t1 t2 t3 t4 "
        chat = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}]
        )
        assert chat.choices[0].message.content == "t0 t1 t2 t3 t4 "
        stream = await client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage:
                usage = chunk.usage
        assert "".join(pieces) == "t0 t1 t2 t3 t4 "
        assert usage is not None and usage.completion_tokens == 5
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="missing", prompt="hi")
        await client.close()


async def test_wrong_method_on_an_openai_endpoint_is_405(backend):
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        r = await c.get("/v1/completions")
        assert r.status_code == 405
        assert r.headers["allow"] == "POST"
        assert r.json()["error"]["message"] == "/v1/completions takes POST"


async def test_reused_request_ids_do_not_collide_in_the_live_table(backend):
    # The backend answers one held request per permit: both stay in flight until released.
    hold = asyncio.Semaphore(0)
    backend.behaviour = Behaviour(chunks=2, hold=hold)
    async with (
        running_proxy(fast_settings([backend.url])) as (url, app),
        httpx.AsyncClient(base_url=url) as c,
    ):
        body = {"model": "fake-model", "prompt": "x"}
        first = asyncio.create_task(
            c.post("/v1/completions", json=body, headers={"x-request-id": "same"})
        )
        await eventually(lambda: backend.active == 1, what="the first request at the backend")
        second = asyncio.create_task(
            c.post("/v1/completions", json=body, headers={"x-request-id": "same"})
        )
        await eventually(lambda: backend.active == 2, what="the second request at the backend")
        assert len(app.core.live.find("same")) == 2
        hold.release()  # the first one waiting on the permit is the first request
        assert (await first).status_code == 200
        assert len(app.core.live.find("same")) == 1
        hold.release()
        assert (await second).status_code == 200
        assert len(app.core.live) == 0


async def test_a_non_ascii_admin_token_is_refused_not_a_crash(backend):
    settings = fast_settings([backend.url], admin_token="s3cret")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.get("/admin/backends", headers={"x-admin-token": "é".encode()})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        r = await c.get("/admin/backends", headers={"x-admin-token": b"s3cret"})
        assert r.status_code == 200


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"url": "http://127.0.0.1:9", "id": "é"}, "printable ASCII"),
        ({"url": "http://127.0.0.1:9", "id": "two words"}, "printable ASCII"),
        ({"url": "http://bücher.example:8000"}, "IDNA"),
    ],
)
async def test_a_backend_id_or_url_that_cannot_go_in_a_header_is_refused(backend, config, fragment):
    async with running_proxy(fast_settings([backend.url])) as (url, app):
        async with httpx.AsyncClient(base_url=url) as c:
            r = await c.post("/admin/backends", json=config)
        assert r.status_code == 400 and fragment in r.json()["error"]["message"]
        assert len(list(app.core.fleet)) == 1


async def test_a_backend_added_at_run_time_names_only_allowed_kv_events_endpoints(backend):
    async with running_proxy(fast_settings([backend.url])) as (url, app):
        async with httpx.AsyncClient(base_url=url) as c:
            far = await c.post(
                "/admin/backends",
                json={"url": "http://127.0.0.1:9", "kv_events_endpoint": "tcp://8.8.8.8:5557"},
            )
            near = await c.post(
                "/admin/backends",
                json={
                    "url": "http://127.0.0.1:9",
                    "kv_events_endpoint": "tcp://127.0.0.1:5557",
                    "kv_events_replay_endpoint": "tcp://127.0.0.1:5558",
                },
            )
        assert far.status_code == 403
        assert "KV-events endpoint refused" in far.json()["error"]["message"]
        assert near.status_code == 201, near.text
        assert near.json()["kv_events_endpoint"] == "tcp://127.0.0.1:5557"
        added = app.core.fleet.get("127.0.0.1:9")
        assert added is not None
        assert added.spec.kv_events_replay_endpoint == "tcp://127.0.0.1:5558"


async def test_a_backend_removed_and_added_again_at_once_is_scraped(backend):
    """The scraper keys its loops by the backend object: the re-added backend gets one."""
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        [view] = (await c.get("/admin/backends")).json()
        assert (await c.delete(f"/admin/backends/{view['id']}")).status_code == 200
        r = await c.post("/admin/backends", json={"url": backend.url, "id": view["id"]})
        assert r.status_code == 201

        async def scraped_again() -> bool:
            [view] = (await c.get("/admin/backends")).json()
            return bool(view["routable"] and view["snapshot_age_seconds"] is not None)

        await eventually(scraped_again, what="the re-added backend scraped and routable")
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
        assert r.status_code == 200


async def test_the_openapi_schema_describes_admin_refusals_as_they_are_answered(backend):
    """FastAPI would document a 422 in its own shape; the admin API answers 4xx in the OpenAI
    shape, and a migrate that does not move answers 409 with its outcome."""
    settings = fast_settings([backend.url], admin_token="s3cret")
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        schema = app.control_app.openapi()
        for path, operations in schema["paths"].items():
            if not path.startswith("/admin/"):
                continue
            for operation in operations.values():
                assert "422" not in operation["responses"], path
                refused = operation["responses"]["4XX"]["content"]["application/json"]
                assert refused["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
        migrate = schema["paths"]["/admin/requests/{request_id}/migrate"]["post"]["responses"]
        assert migrate["409"]["content"]["application/json"]["schema"] == {"type": "object"}
        error = schema["components"]["schemas"]["ErrorDetail"]
        assert set(error["required"]) == {"message", "type", "param", "code"}

        r = await c.post("/admin/backends", json={"url": 5}, headers={"x-admin-token": "s3cret"})
        assert r.status_code == 400
        assert set(r.json()) == {"error"}
        assert set(r.json()["error"]) == set(error["required"])


async def test_ending_a_program_under_a_policy_that_keeps_none_is_409_not_404(backend):
    settings = fast_settings([backend.url], admin_token="s3cret", policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.delete("/admin/programs/p1", headers={"x-admin-token": "s3cret"})
        assert r.status_code == 409
        assert "keeps no programs" in r.text
        r = await c.get("/admin/policy", headers={"x-admin-token": "s3cret"})
        assert r.json() == {
            "name": "round_robin",
            "stats": {"policy": "round_robin", "decisions": 0, "failures": 0},
        }


async def test_a_backend_id_with_a_slash_is_refused_and_others_stay_addressable(backend):
    """The admin API names a backend by its id as one path segment: an id with "/" could be
    added but never drained, evacuated or removed. Other punctuation (a pod's name, a
    host:port) works in every route."""
    other = FakeBackend()
    await other.start()
    try:
        async with (
            running_proxy(fast_settings([backend.url])) as (url, app),
            httpx.AsyncClient(base_url=url) as c,
        ):
            r = await c.post("/admin/backends", json={"url": other.url, "id": "ns/pod-0"})
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error"
            assert "without spaces or '/'" in err["message"] and "ns/pod-0" in err["message"]
            assert len(list(app.core.fleet)) == 1

            odd = "pod-0.ns_a:8000@[x]?%#"
            r = await c.post("/admin/backends", json={"url": other.url, "id": odd})
            assert r.status_code == 201, r.text
            quoted = quote(odd, safe="")
            assert (await c.post(f"/admin/backends/{quoted}/drain")).json()["draining"] is True
            assert (await c.post(f"/admin/backends/{quoted}/undrain")).json()["draining"] is False
            assert (await c.delete(f"/admin/backends/{quoted}")).json()["removed"] == odd
            assert len(list(app.core.fleet)) == 1
    finally:
        await other.stop()


async def routable_ids(c: httpx.AsyncClient, want: int) -> list[str] | None:
    views: list[dict[str, Any]] = (await c.get("/admin/backends")).json()
    ids = [v["id"] for v in views if v["routable"]]
    return ids if len(ids) == want else None


@pytest.mark.parametrize("reason", ["Free text", "x" * 65, "", "MAINTENANCE"])
async def test_an_evacuate_reason_outside_the_metric_label_alphabet_is_refused(backend, reason):
    """The reason labels fleet_proxy_migrations_total: as for migrate, only [a-z0-9_]{1,64}, so a
    client cannot grow /metrics a series per string. A refused evacuate changes nothing."""
    other = FakeBackend()
    await other.start()
    try:
        async with (
            running_proxy(fast_settings([backend.url, other.url])) as (url, _),
            httpx.AsyncClient(base_url=url) as c,
        ):
            ids = await eventually(lambda: routable_ids(c, 2), what="both backends routable")
            r = await c.post(f"/admin/backends/{ids[0]}/evacuate", params={"reason": reason})
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and "reason" in err["message"]
            assert not any(v["draining"] for v in (await c.get("/admin/backends")).json())
            r = await c.post(f"/admin/backends/{ids[0]}/evacuate", params={"reason": "upgrade_2"})
            assert r.status_code == 200 and r.json()["draining"] is True
    finally:
        await other.stop()


async def test_evacuating_the_last_routable_backend_is_refused_and_changes_nothing(backend):
    """Nothing could move off it, and draining it would answer 503 to every new request for its
    model: 409, the backend left as it was. A backend serving only another model does not count.
    A plain drain still stops it on purpose."""
    other, elsewhere = FakeBackend(), FakeBackend(model="other-model")
    await other.start()
    await elsewhere.start()
    try:
        settings = fast_settings([backend.url, other.url, elsewhere.url])
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
            first, last, apart = await eventually(lambda: routable_ids(c, 3), what="all routable")
            assert (await c.post(f"/admin/backends/{first}/evacuate")).status_code == 200
            r = await c.post(f"/admin/backends/{last}/evacuate")
            assert r.status_code == 409
            message = r.json()["error"]["message"]
            assert "no other routable backend" in message and f"{last}/drain" in message
            assert await routable_ids(c, 2) == [last, apart]
            r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
            assert r.status_code == 200 and r.headers["x-fleet-backend"] == last
            # Once the first is back, the last one can be evacuated.
            assert (await c.post(f"/admin/backends/{first}/undrain")).status_code == 200
            assert (await c.post(f"/admin/backends/{last}/evacuate")).status_code == 200
            assert await routable_ids(c, 2) == [first, apart]
            # The only backend left: /ready stays 200 after the refusal.
            assert (await c.post(f"/admin/backends/{apart}/drain")).status_code == 200
            assert (await c.post(f"/admin/backends/{first}/evacuate")).status_code == 409
            assert await routable_ids(c, 1) == [first]
            assert (await c.get("/ready")).status_code == 200
    finally:
        await other.stop()
        await elsewhere.stop()


async def test_live_requests_say_apart_moving_on_failure_and_moving_by_order(backend):
    """A seeded request moves when its backend fails (the seed goes on with it) but not on an
    order: the list says both, and migrate agrees with it."""
    hold = asyncio.Semaphore(0)
    backend.behaviour = Behaviour(chunks=2, hold=hold)
    async with (
        running_proxy(fast_settings([backend.url])) as (url, _),
        httpx.AsyncClient(base_url=url) as c,
    ):
        base = {"model": "fake-model", "prompt": "x", "stream": True}
        tasks = [
            asyncio.create_task(c.post("/v1/completions", json=body, headers={"x-request-id": rid}))
            for rid, body in (("seeded", {**base, "seed": 7}), ("plain", base))
        ]
        await eventually(lambda: backend.active == 2, what="both requests at the backend")
        rows = {r["request_id"]: r for r in (await c.get("/admin/requests")).json()}
        moves = ("movable", "not_movable_reason", "planned_movable", "planned_not_movable_reason")
        assert [rows["seeded"][k] for k in moves] == [True, None, False, "seed"]
        assert [rows["plain"][k] for k in moves] == [True, None, True, None]
        r = await c.post("/admin/requests/seeded/migrate", json={})
        assert r.status_code == 409 and r.json()["detail"] == "seed"
        hold.release()
        hold.release()
        assert [(await t).status_code for t in tasks] == [200, 200]
