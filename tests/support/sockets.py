"""Sockets that misbehave the way a busy server does, for tests on real loopback ports."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def unanswering_listener() -> Iterator[str]:
    """A port whose accept queue is full: the kernel drops further SYNs, so connecting
    times out (as it does to an engine too busy to accept), rather than being refused.
    Yields its origin, `http://127.0.0.1:PORT`."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # Linux queues backlog + 1 connections; a few more to be sure
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            fillers.append(s)
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in fillers:
            s.close()
        listener.close()
