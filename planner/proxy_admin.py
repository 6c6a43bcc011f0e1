"""The planner's side of the proxy's admin API, the client and not the API: `ProxyAdmin`, the
calls the planner makes of a proxy (list backends and live requests, add, drain, undrain,
evacuate, remove), and `HttpProxyAdmin`, those calls over HTTP with httpx (`fleet-proxy plan`).
Inside the proxy the same calls are `InProcessAdmin` (proxy/control/colocated_planner.py); the
API itself is proxy/control/admin_routes.py.

The live requests are those of the proxy process that answers: with `--workers N` each worker
process has its own, and the backend's `in_flight` is that process's count too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from fleet.types import Role
from planner.traffic import BackendReading, RequestCounters


@dataclass(frozen=True, slots=True)
class BackendStatus:
    id: str
    url: str
    role: Role
    draining: bool
    in_flight: int
    waiting: float | None  # None: not scraped yet
    kv_usage: float | None
    running: float | None = None  # None: not scraped yet
    counters: RequestCounters | None = None  # None: not scraped yet

    def reading(self) -> BackendReading | None:
        """Its request counters for the SLA mode; None before its first scrape."""
        if self.counters is None:
            return None
        return BackendReading(self.id, self.role, self.running or 0.0, self.counters)


@dataclass(frozen=True, slots=True)
class LiveRequest:
    backend: str
    charged_prompt_tokens: int  # the uncached prompt part its backend was charged
    tokens_generated: int

    @property
    def tokens(self) -> int:
        return self.charged_prompt_tokens + self.tokens_generated


class ProxyAdmin(Protocol):
    async def backends(self) -> list[BackendStatus]: ...

    async def live_requests(self) -> list[LiveRequest]: ...

    async def add_backend(self, backend_id: str, url: str, role: Role) -> None: ...

    async def drain(self, backend_id: str) -> None: ...

    async def undrain(self, backend_id: str) -> None: ...

    async def evacuate(self, backend_id: str) -> dict[str, int]:
        """Move every movable live request off the backend: outcome -> requests."""
        ...

    async def remove_backend(self, backend_id: str) -> None: ...


class HttpProxyAdmin:
    """`ProxyAdmin` over a proxy's admin API; the client carries the admin token header."""

    def __init__(self, client: httpx.AsyncClient, proxy_url: str) -> None:
        self.client = client
        self.base = proxy_url.rstrip("/") + "/admin"

    async def backends(self) -> list[BackendStatus]:
        r = await self.client.get(f"{self.base}/backends")
        r.raise_for_status()
        return [_backend(b) for b in r.json()]

    async def live_requests(self) -> list[LiveRequest]:
        r = await self.client.get(f"{self.base}/requests")
        r.raise_for_status()
        return [
            LiveRequest(
                backend=str(x.get("backend") or ""),
                charged_prompt_tokens=int(x.get("charged_prompt_tokens") or 0),
                tokens_generated=int(x.get("tokens_generated") or 0),
            )
            for x in r.json()
        ]

    async def add_backend(self, backend_id: str, url: str, role: Role) -> None:
        body = {"id": backend_id, "url": url, "role": role.value}
        r = await self.client.post(f"{self.base}/backends", json=body)
        r.raise_for_status()

    async def drain(self, backend_id: str) -> None:
        r = await self.client.post(f"{self.base}/backends/{backend_id}/drain")
        r.raise_for_status()

    async def undrain(self, backend_id: str) -> None:
        r = await self.client.post(f"{self.base}/backends/{backend_id}/undrain")
        r.raise_for_status()

    async def evacuate(self, backend_id: str) -> dict[str, int]:
        # Each move may take up to the proxy's move_timeout; the client's timeout bounds it.
        r = await self.client.post(f"{self.base}/backends/{backend_id}/evacuate")
        r.raise_for_status()
        outcomes: dict[str, Any] = r.json().get("outcomes", {})
        return {str(k): int(v) for k, v in outcomes.items()}

    async def remove_backend(self, backend_id: str) -> None:
        r = await self.client.delete(f"{self.base}/backends/{backend_id}")
        if r.status_code != 404:  # already gone is what was wanted
            r.raise_for_status()


def admin_client(admin_token: str | None, timeout: float = 30.0) -> httpx.AsyncClient:
    """A client for `HttpProxyAdmin`: the token header when a token is given."""
    headers = {"x-admin-token": admin_token} if admin_token else {}
    return httpx.AsyncClient(headers=headers, timeout=timeout)


def _backend(b: dict[str, Any]) -> BackendStatus:
    metrics = b.get("metrics") or {}
    load = b.get("load") or {}
    return BackendStatus(
        id=str(b["id"]),
        url=str(b["url"]),
        role=Role(b.get("role", Role.BOTH.value)),
        draining=bool(b.get("draining")),
        in_flight=int(load.get("in_flight", 0)),
        waiting=float(metrics["waiting"]) if "waiting" in metrics else None,
        kv_usage=float(metrics["kv_usage"]) if "kv_usage" in metrics else None,
        running=float(metrics["running"]) if "running" in metrics else None,
        counters=_counters(metrics),
    )


def _counters(metrics: dict[str, Any]) -> RequestCounters | None:
    """The request counters, when the proxy publishes them (an older proxy does not)."""
    names = [f.name for f in dataclasses.fields(RequestCounters)]
    if not all(n in metrics for n in names):
        return None
    return RequestCounters(**{n: float(metrics[n]) for n in names})
