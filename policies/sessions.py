"""Session -> backend memory: a bounded LRU table, and the plugin base that keeps one."""

from __future__ import annotations

from collections import OrderedDict

from policies.base import Decision
from policies.plugin import SchedulingRequest
from policies.plugin_base import PluginBase


class AffinityTable:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._owners: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        return self._owners.get(key)

    def set(self, key: str, backend_id: str) -> None:
        self._owners[key] = backend_id
        self._owners.move_to_end(key)
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def pop(self, key: str) -> str | None:
        return self._owners.pop(key, None)

    def forget_backend(self, backend_id: str) -> int:
        stale = [k for k, v in self._owners.items() if v == backend_id]
        for k in stale:
            del self._owners[k]
        return len(stale)

    def __len__(self) -> int:
        return len(self._owners)


class SessionOwnerPlugin(PluginBase):
    """A plugin that remembers the backend of each session's last request."""

    def __init__(self, max_sessions: int, name: str = "") -> None:
        super().__init__(name)
        self.sessions = AffinityTable(max_sessions)

    def owner(self, req: SchedulingRequest) -> str | None:
        sid = req.ctx.session_id
        return None if sid is None else self.sessions.get(sid)

    def on_picked(self, req: SchedulingRequest, decision: Decision) -> None:
        if req.ctx.session_id is not None:
            self.sessions.set(req.ctx.session_id, decision.target.id)

    def on_backend_removed(self, backend_id: str) -> None:
        self.sessions.forget_backend(backend_id)
