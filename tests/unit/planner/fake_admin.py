"""An in-memory `ProxyAdmin` for the planner's runtime tests: backends, live requests, and a
log of every admin call in order."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from fleet.types import Role
from planner.proxy_admin import BackendStatus, LiveRequest


@dataclass
class FakeAdmin:
    backends_by_id: dict[str, BackendStatus] = field(default_factory=dict)
    live: list[LiveRequest] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    # Requests evacuate cannot move (not movable): they stay on their backend.
    stuck: set[int] = field(default_factory=set)  # indexes into `live`
    # Called on every live_requests(): lets a test finish requests as time goes.
    on_poll: Callable[[FakeAdmin], None] | None = None

    def add(self, backend_id: str, role: Role, kv: float = 0.0, waiting: float = 0.0) -> None:
        self.backends_by_id[backend_id] = BackendStatus(
            backend_id, f"http://127.0.0.1/{backend_id}", role, False, 0, waiting, kv
        )

    def set_kv(self, kv: float) -> None:
        for b in list(self.backends_by_id.values()):
            if b.role is not Role.PREFILL:
                self.backends_by_id[b.id] = dataclasses.replace(b, kv_usage=kv)

    async def backends(self) -> list[BackendStatus]:
        return list(self.backends_by_id.values())

    async def live_requests(self) -> list[LiveRequest]:
        if self.on_poll is not None:
            self.on_poll(self)
        return list(self.live)

    async def add_backend(self, backend_id: str, url: str, role: Role) -> None:
        self.calls.append(("add", backend_id))
        self.add(backend_id, role)

    async def drain(self, backend_id: str) -> None:
        self.calls.append(("drain", backend_id))
        self._draining(backend_id, True)

    async def undrain(self, backend_id: str) -> None:
        self.calls.append(("undrain", backend_id))
        self._draining(backend_id, False)

    async def evacuate(self, backend_id: str) -> dict[str, int]:
        self.calls.append(("evacuate", backend_id))
        others = [b for b in self.backends_by_id if b != backend_id]
        moved = 0
        for i, r in enumerate(self.live):
            if r.backend == backend_id and i not in self.stuck and others:
                self.live[i] = dataclasses.replace(r, backend=others[0])
                moved += 1
        return {"ok": moved} if moved else {}

    async def remove_backend(self, backend_id: str) -> None:
        self.calls.append(("remove", backend_id))
        self.backends_by_id.pop(backend_id, None)

    def _draining(self, backend_id: str, draining: bool) -> None:
        b = self.backends_by_id[backend_id]
        self.backends_by_id[backend_id] = dataclasses.replace(b, draining=draining)
