"""With several workers: each request's arrival and end keeps the worker's peer sync in step.

A request steps the sync when its interval has passed (proxy/control/peer_sync.py), so the
request is routed on its peers' load as of now even after a quiet spell, and a busy worker
shares its load without a timer waking it. `inside` counts the requests in the app, so the
sync's timer knows the worker is busy before a request has reached a backend."""

from __future__ import annotations

from proxy.asgi import AsgiApp, Receive, Scope, Send
from proxy.control.peer_sync import PeerSync


class PeerTouch:
    """ASGI wrapper, outermost, only with several workers: a count and a clock read at a
    request's arrival and at its end, and a step (about 10 us) when one is due."""

    def __init__(self, app: AsgiApp, sync: PeerSync) -> None:
        self.app = app
        self.sync = sync

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # lasts as long as the server: not a request
            await self.app(scope, receive, send)
            return
        self.sync.arrive()
        try:
            await self.app(scope, receive, send)
        finally:
            self.sync.leave()
