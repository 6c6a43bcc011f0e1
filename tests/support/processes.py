"""Child processes and the loopback ports they hold, as the tests see them through /proc."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path


def alive(pid: int) -> bool:
    """Running (a zombie has finished: its parent has only not reaped it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every process below `pid`: its children, theirs, and so on."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            with contextlib.suppress(FileNotFoundError):
                children = {int(c) for c in (task / "children").read_text().split()}
                todo += children - found
                found |= children
    return found


def free_port() -> int:
    """A loopback port nothing listens on now: connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def port_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:`port` (closed connections in TIME_WAIT do not count, as
    for a server binding with SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def refused(port: int) -> bool:
    """Connecting to 127.0.0.1:`port` is refused now (an accepted connection is closed)."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except (ConnectionRefusedError, ConnectionResetError):
        # A reset during the handshake: the listening socket closed while this connection was
        # being set up, the moment of refusal itself. Either way the client is turned away.
        return True
    writer.close()
    return False
