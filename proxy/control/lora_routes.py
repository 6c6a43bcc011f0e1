"""`POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`, vLLM's run-time LoRA
routes, served for the whole fleet (proxy/control/lora_adapters.py) to holders of the admin
token (`x-admin-token`): they change what every engine serves. With no admin_token set they
are refused, whoever asks: a client of the OpenAI endpoints must not load weights.
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from proxy.control.lora_adapters import FleetAdapters
from proxy.errors import ProxyError

NO_TOKEN = (
    "fleet-proxy serves {path} to holders of the admin token only, and none is set: set "
    "admin_token (in the config file, FLEET_PROXY_ADMIN_TOKEN, or --admin-token) and send it "
    "as x-admin-token"
)


class _Target(BaseModel):
    # vLLM's own fields (load_inplace, lora_int_id...) go on to the engines as sent.
    model_config = ConfigDict(extra="allow")

    lora_name: str = Field(min_length=1)
    base_model: str | None = None
    model: str | None = None  # the base model, as vLLM's other requests name it
    backends: list[str] | None = Field(default=None, min_length=1)

    def extra(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class LoadAdapter(_Target):
    lora_path: str = Field(min_length=1)


class UnloadAdapter(_Target):
    pass


class TokenCheck:
    """None when the request carries the admin token, else the refusal to answer with."""

    def __init__(self, token: SecretStr | None) -> None:
        self._token = token

    def __call__(self, given: str | None) -> ProxyError | None:
        if self._token is None:
            message = NO_TOKEN.format(path="the LoRA adapter routes")
            return ProxyError(403, message, type="permission_error")
        # As bytes: a header may hold any byte, and compare_digest refuses non-ASCII str.
        if given is None or not secrets.compare_digest(
            given.encode("latin-1"), self._token.get_secret_value().encode("utf-8")
        ):
            return ProxyError(401, "admin token missing or wrong", type="authentication_error")
        return None


def _error(e: ProxyError) -> Response:
    return Response(e.body(), status_code=e.status, media_type="application/json")


def lora_router(adapters: FleetAdapters, token: SecretStr | None) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    check = TokenCheck(token)

    # The token is checked in the handlers, not as a dependency: its refusals answer in the
    # OpenAI shape with their own error type.
    @router.post("/v1/load_lora_adapter")
    async def load(
        request: LoadAdapter, x_admin_token: str | None = Header(default=None)
    ) -> Response:
        refusal = check(x_admin_token)
        if refusal is not None:
            return _error(refusal)
        try:
            status, body = await adapters.load(
                request.lora_name,
                request.lora_path,
                request.base_model or request.model,
                request.backends,
                request.extra(),
            )
        except ProxyError as e:
            return _error(e)
        return JSONResponse(status_code=status, content=body)

    @router.post("/v1/unload_lora_adapter")
    async def unload(
        request: UnloadAdapter, x_admin_token: str | None = Header(default=None)
    ) -> Response:
        refusal = check(x_admin_token)
        if refusal is not None:
            return _error(refusal)
        try:
            status, body = await adapters.unload(
                request.lora_name, request.backends, request.extra()
            )
        except ProxyError as e:
            return _error(e)
        return JSONResponse(status_code=status, content=body)

    return router
