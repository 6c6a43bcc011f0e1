"""Client access control: API keys on the OpenAI endpoints, the backends' own key, and CORS.

Client keys are checked as vLLM's `--api-key` checks them: the `Authorization: Bearer <key>`
value (or, without one, the `x-api-key: <key>` Anthropic's clients send) is hashed with
SHA-256 and compared, in constant time, with the digest of every accepted key (all of them,
so the time taken says nothing about which key nearly matched, nor about a key's length).
The digests are computed once, at start-up.

The hot path pays for this only when keys are configured: `create_app` then gives the OpenAI
endpoints' `Forwarder` a `RequireClientKey` to authorize each request with, and wraps the
control plane in `ControlPlaneKeys`; with no keys the Forwarder checks nothing (one `is None`)
and the FastAPI app serves as before.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from proxy.asgi import AsgiApp, Receive, Scope, Send, send_error
from proxy.errors import ProxyError
from proxy.request.routes import HOT_ROUTES
from proxy.settings import check_api_key


class KeyCheck(Protocol):
    """What the OpenAI endpoints ask of the configured client keys."""

    def allows(self, authorization: str | None) -> bool: ...

    def refusal(self, authorization: str | None) -> ProxyError: ...

    def tenant(self, authorization: str | None) -> str | None:
        """The tenant an accepted key names; None when it names none."""


def read_keys_file(path: Path) -> list[tuple[str, str | None]]:
    """One key per line, optionally followed by the tenant it names (`KEY tenant=NAME`); blank
    lines and `#` comments are skipped. A missing, unreadable or keyless file raises ValueError
    naming it: a proxy meant to be closed must not start open."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"api_keys_file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"api_keys_file {path}: cannot be read: {e}") from None
    keys: list[tuple[str, str | None]] = []
    for number, line in enumerate(text.splitlines(), 1):
        key, named, tenant = line.split("#", 1)[0].strip().partition(" tenant=")
        key, tenant = key.strip(), tenant.strip()
        if not key:
            continue
        try:
            check_api_key(key)
            if named and not tenant:
                raise ValueError("`tenant=` names no tenant")
        except ValueError as e:
            raise ValueError(f"api_keys_file {path}, line {number}: {e}") from None
        keys.append((key, tenant or None))
    if not keys:
        raise ValueError(f"api_keys_file {path} holds no key (one key per line, # comments)")
    return keys


class ClientKeys:
    """The accepted client keys, as SHA-256 digests."""

    __slots__ = ("_digests", "_missing", "_tenants", "_wrong")

    def __init__(self, keys: Iterable[str], tenants: Mapping[str, str] | None = None) -> None:
        """`tenants`: key -> the tenant it names, for the keys that name one."""
        self._digests = tuple(hashlib.sha256(k.encode("utf-8")).digest() for k in keys)
        if not self._digests:
            raise ValueError("ClientKeys needs at least one key")
        self._tenants = {
            hashlib.sha256(k.encode("utf-8")).digest(): t for k, t in (tenants or {}).items()
        }
        # Built once: a refused request costs no more than an accepted one.
        self._missing = _unauthorized(
            "no API key: send it as `Authorization: Bearer <key>` (the OpenAI SDKs' api_key) "
            "or `x-api-key: <key>` (the Anthropic SDKs')"
        )
        self._wrong = _unauthorized("incorrect API key provided")

    def allows(self, authorization: str | None) -> bool:
        """`authorization`: the request's header value, as the server decoded it (latin-1)."""
        if authorization is None:
            return False
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(key.strip().encode("latin-1")).digest()
        found = False
        for accepted in self._digests:  # every one of them: no early exit
            found |= hmac.compare_digest(digest, accepted)
        return found

    def refusal(self, authorization: str | None) -> ProxyError:
        return self._missing if authorization is None else self._wrong

    def tenant(self, authorization: str | None) -> str | None:
        # Asked only of a key `allows` accepted: a plain lookup leaks nothing more.
        if authorization is None or not self._tenants:
            return None
        key = authorization.partition(" ")[2].strip()
        return self._tenants.get(hashlib.sha256(key.encode("latin-1")).digest())


def _unauthorized(message: str) -> ProxyError:
    # OpenAI's own answer to a bad key: 401, invalid_request_error, code invalid_api_key.
    return ProxyError(
        401,
        message,
        type="invalid_request_error",
        code="invalid_api_key",
        headers=[(b"www-authenticate", b"Bearer")],
    )


def client_keys(
    api_keys: Iterable[tuple[str, str | None]], keys_file: Path | None
) -> ClientKeys | None:
    """The keys (each with the tenant it names, or None) from the settings and the keys file
    together; None when neither gives any."""
    keys = list(api_keys)
    if keys_file is not None:
        keys += read_keys_file(keys_file)
    if not keys:
        return None
    return ClientKeys([k for k, _ in keys], {k: t for k, t in keys if t is not None})


_CREDENTIAL_HEADERS = (b"authorization", b"x-api-key")


def presented_credential(headers: Mapping[str, str]) -> str | None:
    """The credential a request presents, as an `Authorization` value: that header as sent,
    else `x-api-key: <key>` (Anthropic's clients) read as `Bearer <key>`. The one place both
    the OpenAI endpoints and the control plane read a client's key."""
    authorization = headers.get("authorization")
    if authorization is not None:
        return authorization
    key = headers.get("x-api-key")
    return None if key is None else "Bearer " + key


class RequireClientKey:
    """The OpenAI endpoints' authorization (the Forwarder's `Authorize`) when client keys are
    configured: a request without an accepted key is answered 401."""

    __slots__ = ("_keys",)

    def __init__(self, keys: KeyCheck) -> None:
        self._keys = keys

    def __call__(self, headers: dict[str, str]) -> ProxyError | None:
        authorization = presented_credential(headers)
        if self._keys.allows(authorization):
            return None
        return self._keys.refusal(authorization)


def _needs_key(path: str) -> bool:
    # The OpenAI-compatible paths; /health, /ready and /metrics stay open for probes and
    # scrapers, /admin has its own token. scope["path"], never a URL rebuilt from Host.
    return path.startswith("/v1/") or path == "/v1" or path in HOT_ROUTES


class ControlPlaneKeys:
    """The control plane's app behind the client keys, for its OpenAI paths (`/v1/models`,
    a wrong method on a generation endpoint, unknown `/v1/...` paths)."""

    def __init__(self, app: AsgiApp, keys: KeyCheck) -> None:
        self._app = app
        self._keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A CORS preflight carries no credentials by design: it passes (CORS answers it).
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and _needs_key(scope["path"]):
            authorization = presented_credential(
                {
                    name.decode("latin-1"): value.decode("latin-1")
                    for name, value in scope["headers"]
                    if name in _CREDENTIAL_HEADERS
                }
            )
            if not self._keys.allows(authorization):
                await send_error(send, self._keys.refusal(authorization), "")
                return
        await self._app(scope, receive, send)
