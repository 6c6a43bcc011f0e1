"""Who may use the admin API: the admin token's holders when one is configured
(`x-admin-token: <token>`; not `Authorization`, which carries the client's API key on the
OpenAI endpoints). With no token configured it answers loopback clients only, and nobody when
the proxy listens beyond loopback.
"""

from __future__ import annotations

import secrets

from fastapi import Header, HTTPException, Request
from pydantic import SecretStr

from proxy.url_policy import is_loopback, listens_on_loopback


class AdminAccess:
    """The admin router's dependency (`Depends(access.check)`): refuses whom it must."""

    def __init__(self, token: SecretStr | None, host: str) -> None:
        self.token = token
        # Listening beyond loopback, the API is exposed whoever connects: a client address
        # may be loopback yet stand for anyone (a sidecar or reverse proxy on this host), so
        # with no token the listener's bind address decides, and an exposed one refuses
        # everybody.
        self.exposed = not listens_on_loopback(host)
        self.exposed_refusal = (
            f"the admin API is off: this proxy listens on {host} and no admin_token is "
            "set; set one (admin_token in the config file, FLEET_PROXY_ADMIN_TOKEN, or "
            "--admin-token) and send it as x-admin-token"
        )

    def check(self, request: Request, x_admin_token: str | None = Header(default=None)) -> None:
        if self.token is None:
            if self.exposed:
                raise HTTPException(status_code=403, detail=self.exposed_refusal)
            client = request.client
            if client is None or not is_loopback(client.host):
                raise HTTPException(
                    status_code=403,
                    detail="the admin API answers only loopback clients when no admin_token is set",
                )
            return
        # As bytes: a header's value may hold any byte (the server decodes it as latin-1),
        # and compare_digest refuses non-ASCII str.
        if x_admin_token is None or not secrets.compare_digest(
            x_admin_token.encode("latin-1"), self.token.get_secret_value().encode("utf-8")
        ):
            raise HTTPException(status_code=401, detail="admin token missing or wrong")
