"""Which client connection to close when a server's connection table is full
(docs/reliability.md, "When the connection table is full").

A full table would otherwise refuse every new connection for as long as a flood of idle,
half-sent or dribbling sockets holds it. Instead a new connection takes the place of a waiting
one, as nginx and Envoy's overload manager do:

- first one that has sent nothing, or part of a request's headers, since it opened or since
  its last response: the one waiting longest (as far as the search has found out);
- failing that, one whose request body is still arriving, the oldest;
- never one whose request is being served (a stream, a response going out).

A client address holding at least `share` of the table competes only with itself: its new
connection takes the place of one of its own waiting connections, or is refused, and the
waiting connections of such addresses go first when another address needs room.

The work per connection is a few dictionary operations when it opens and closes, none per
request: a connection that starts a new wait (a keep-alive connection between requests) is
found out, and moved to the back, only when a search for room reaches it.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Generic, Protocol, TypeVar

# Connections looked at per search for room, oldest first: a table of busy connections costs
# a new connection this much before its refusal, not a walk over the whole table. Those looked
# at and kept go to the back, so the next search looks at others.
SEARCH_LIMIT = 64


class DoorState(enum.Enum):
    IDLE = "idle"  # nothing of a request sent since it opened or its last response
    HEAD = "head"  # part of a request's headers sent
    BODY = "body"  # headers complete, body still arriving, no response started
    BUSY = "busy"  # a request being served or answered
    GONE = "gone"  # closing


class Evictable(Protocol):
    """What the table asks of a connection."""

    def door_state(self) -> DoorState:
        """Where the connection stands now."""

    def wait_mark(self) -> object:
        """Changes each time the connection begins a new request (its current request's
        object, say): the same mark twice means no request began in between."""

    def evict(self, state: DoorState) -> None:
        """Close the connection, found in `state`, to make room for a new one."""


C = TypeVar("C", bound=Evictable)

# The mark of a connection found busy: whatever it waits for next began after the search.
_BUSY = object()


class ConnectionTable(Generic[C]):
    """The open connections of one server by client address, in the order they began waiting
    (as far as a search for room has found out), and the choice of which to close."""

    def __init__(self, capacity: int, share: float) -> None:
        # The connections an address may hold before it competes only with itself.
        self.address_cap = max(1, int(capacity * share))
        self._all: OrderedDict[C, object] = OrderedDict()
        self._by_address: dict[str, OrderedDict[C, object]] = {}
        # Addresses holding address_cap connections or more.
        self._crowded: set[str] = set()

    def __len__(self) -> int:
        return len(self._all)

    def held_by(self, address: str) -> int:
        own = self._by_address.get(address)
        return 0 if own is None else len(own)

    def opened(self, conn: C, address: str) -> None:
        mark = conn.wait_mark()
        self._all[conn] = mark
        own = self._by_address.get(address)
        if own is None:
            own = self._by_address[address] = OrderedDict()
        own[conn] = mark
        if len(own) == self.address_cap:
            self._crowded.add(address)

    def closed(self, conn: C, address: str) -> None:
        self._all.pop(conn, None)
        own = self._by_address.get(address)
        if own is None:
            return
        own.pop(conn, None)
        if len(own) < self.address_cap:
            self._crowded.discard(address)
            if not own:
                del self._by_address[address]

    def make_room(self, address: str) -> bool:
        """Close one connection so that one from `address` may open; False when none may be
        closed (the new one is to be refused)."""
        own = self._by_address.get(address)
        if own is not None and len(own) >= self.address_cap:
            return self._evict_from(own)
        for crowded in sorted(self._crowded, key=self.held_by, reverse=True):
            if self._evict_from(self._by_address[crowded]):
                return True
        return self._evict_from(self._all)

    def _evict_from(self, queue: OrderedDict[C, object]) -> bool:
        victim, state = choose_victim(queue, SEARCH_LIMIT)
        if victim is None:
            return False
        victim.evict(state)
        return True


def choose_victim(queue: OrderedDict[C, object], limit: int) -> tuple[C | None, DoorState]:
    """The connection to close among the first `limit` of `queue` (connection -> its mark when
    queued, oldest first): the first waiting since it was queued (IDLE or HEAD with the same
    mark); else the first waiting anew (a keep-alive connection between requests); else the
    first whose body is still arriving. Those looked at and not chosen go to the back, marked
    anew; closing ones leave the queue (they are on their way out)."""
    waiting_anew: tuple[C, DoorState] | None = None
    first_body: C | None = None
    for _ in range(min(limit, len(queue))):
        conn, mark = queue.popitem(last=False)
        state = conn.door_state()
        if state is DoorState.GONE:
            continue
        if state is DoorState.IDLE or state is DoorState.HEAD:
            now = conn.wait_mark()
            if now is mark:
                return conn, state
            queue[conn] = now  # its wait began after it was queued
            if waiting_anew is None:
                waiting_anew = conn, state
        else:
            queue[conn] = _BUSY
            if state is DoorState.BODY and first_body is None:
                first_body = conn
    if waiting_anew is not None:
        return waiting_anew
    if first_body is not None:
        return first_body, DoorState.BODY
    return None, DoorState.GONE
