"""Schemathesis over the control plane (health, readiness, models, metrics, the admin API),
against the real proxy on a loopback port, with an admin token and without one.

The schema comes from the FastAPI app object, so the test needs nothing served that users do
not get. Checks: no 5xx, responses conform where the schema declares them, and every error
is OpenAI-shaped.

The admin API adds backends by URL and then reaches them (health checks, scrapes): every URL
the proxy would accept is replaced by one of the simulated engines' before it is sent, and the
fleet is checked after each call to hold nothing else.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from pydantic import ValidationError
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from proxy.serving.app import create_app
from proxy.settings import BackendConfig, load_settings
from tests.fuzz.checks import assert_openai_error_body
from tests.fuzz.live import REQUEST_TIMEOUT_S, LiveProxy, fuzz_settings, live_proxy

pytestmark = pytest.mark.fuzz

TOKEN = "fuzz-admin-token"
EXAMPLES = 25


def control_plane_schema() -> dict[str, Any]:
    """The app's own OpenAPI schema (its routes do not depend on the settings), plus /metrics,
    which the app leaves out of it."""
    schema = create_app(load_settings({})).control_app.openapi()
    schema["paths"]["/metrics"] = {
        "get": {
            "operationId": "metrics",
            "responses": {
                "200": {
                    "description": "Prometheus text",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        }
    }
    return schema


SCHEMA = schemathesis.openapi.from_dict(control_plane_schema())
SCHEMA.config.generation.update(
    max_examples=EXAMPLES, database="none", deterministic=bool(os.environ.get("CI"))
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def confine_backend_url(case: schemathesis.Case[Any], allowed: list[str]) -> None:
    """The URL of a backend to add: one the proxy would take becomes one of `allowed` (in one
    of the spellings the proxy normalizes). The schema says only "a string" for the URL and the
    id, so most generated ones are refused; two in three such URLs become one of `allowed`, and
    such ids (but the empty one) a printable one, so that adding runs too."""
    if case.method.upper() != "POST" or case.path != "/admin/backends":
        return
    body = case.body
    if isinstance(body, str | bytes):
        # Raw bytes that happen to be a JSON object are confined the same way.
        try:
            body = json.loads(body)
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        case.body = body
    if not isinstance(body, dict):
        return
    url = body.get("url")
    if isinstance(url, str) and (_accepted({"url": url}) or len(url) % 3 != 1):
        body["url"] = allowed[len(url) % len(allowed)] + ["", "/", "/v1", "/v1/"][len(url) % 4]
    backend_id = body.get("id")
    if (
        backend_id
        and isinstance(backend_id, str)
        and not _accepted({"url": "http://x", "id": backend_id})
    ):
        body["id"] = "fuzz-" + backend_id.encode("utf-8", "surrogatepass").hex()[:40]


def _accepted(config: dict[str, Any]) -> bool:
    try:
        BackendConfig.model_validate(config)
    except ValidationError:
        return False
    return True


def assert_fleet_confined(live: LiveProxy) -> None:
    async def urls() -> set[str]:
        return {b.url for b in live.app.core.fleet}

    assert live.run(urls()) <= set(live.sim_urls)


def exercise(
    case: schemathesis.Case[Any],
    live: LiveProxy,
    session: requests.Session,
    headers: dict[str, str] | None = None,
) -> None:
    confine_backend_url(case, live.sim_urls)
    response = case.call(
        base_url=live.url, session=session, headers=headers, timeout=REQUEST_TIMEOUT_S
    )
    case.validate_response(response, checks=CHECKS)
    outcome = case.path.endswith("/migrate") and response.status_code == 409
    if response.status_code >= 400 and not outcome:
        content_type = response.headers.get("content-type", [""])[0]
        assert_openai_error_body(response.content, content_type)
    assert_fleet_confined(live)


@pytest.fixture(scope="module")
def open_proxy() -> Iterator[LiveProxy]:
    with live_proxy(engines=2) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def guarded_proxy() -> Iterator[LiveProxy]:
    with live_proxy(engines=2, admin_token=TOKEN) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    # One keep-alive connection for the run rather than one per case.
    with requests.Session() as s:
        yield s


@SCHEMA.parametrize()
@fuzz_settings(max_examples=EXAMPLES)
def test_control_plane_without_an_admin_token(
    case: schemathesis.Case[Any], open_proxy: LiveProxy, session: requests.Session
) -> None:
    exercise(case, open_proxy, session)


@SCHEMA.parametrize()
@fuzz_settings(max_examples=EXAMPLES)
def test_control_plane_with_an_admin_token(
    case: schemathesis.Case[Any], guarded_proxy: LiveProxy, session: requests.Session
) -> None:
    # Half the cases as generated (mostly refused: 401), the others with the token, so that
    # the admin operations run; chosen by content, so a failing case replays the same way.
    drawn = [case.path_parameters, case.query, case.headers, case.body]
    text = json.dumps(
        drawn, default=lambda o: o.hex() if isinstance(o, bytes) else type(o).__name__
    )
    headers = {"x-admin-token": TOKEN} if zlib.crc32(text.encode()) % 2 else None
    exercise(case, guarded_proxy, session, headers)
