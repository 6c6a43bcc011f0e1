"""The choice of which client connection a full table closes (proxy/serving/connection_table.py),
on stand-in connections. tests/integration/test_front_door.py shows it on real sockets."""

from __future__ import annotations

from collections import OrderedDict

from proxy.serving.connection_table import (
    SEARCH_LIMIT,
    ConnectionTable,
    DoorState,
    choose_victim,
)


class Conn:
    def __init__(self, name: str, state: DoorState = DoorState.IDLE) -> None:
        self.name = name
        self.state = state
        self.request: object = None  # what wait_mark gives: a new object per request
        self.evicted: DoorState | None = None

    def door_state(self) -> DoorState:
        return DoorState.GONE if self.evicted is not None else self.state

    def wait_mark(self) -> object:
        return self.request

    def evict(self, state: DoorState) -> None:
        self.evicted = state

    def serve_a_request(self) -> None:
        """A keep-alive connection that has served a request since: waiting again, anew."""
        self.request = object()

    def __repr__(self) -> str:
        return self.name


def table(capacity: int = 10, share: float = 0.5) -> ConnectionTable[Conn]:
    return ConnectionTable(capacity, share)


def fill(t: ConnectionTable[Conn], address: str, *conns: Conn) -> None:
    for c in conns:
        t.opened(c, address)


def test_the_connection_waiting_longest_goes_first_whatever_it_sent() -> None:
    t = table(share=1.0)
    a, b, c = Conn("a", DoorState.HEAD), Conn("b"), Conn("c", DoorState.HEAD)
    fill(t, "10.0.0.1", a, b, c)
    assert t.make_room("10.0.0.2")
    assert (a.evicted, b.evicted, c.evicted) == (DoorState.HEAD, None, None)
    assert t.make_room("10.0.0.2")
    assert b.evicted is DoorState.IDLE


def test_a_request_being_served_is_never_closed() -> None:
    t = table(share=1.0)
    busy = [Conn(f"busy{i}", DoorState.BUSY) for i in range(5)]
    fill(t, "10.0.0.1", *busy)
    assert not t.make_room("10.0.0.2")
    assert all(c.evicted is None for c in busy)
    assert len(t) == 5


def test_a_dribbling_body_goes_only_when_nothing_waits_for_its_headers() -> None:
    t = table(share=1.0)
    body, busy = Conn("body", DoorState.BODY), Conn("busy", DoorState.BUSY)
    head = Conn("head", DoorState.HEAD)
    fill(t, "10.0.0.1", body, busy, head)
    assert t.make_room("10.0.0.2")
    assert (head.evicted, body.evicted) == (DoorState.HEAD, None)
    assert t.make_room("10.0.0.2")
    assert body.evicted is DoorState.BODY
    assert not t.make_room("10.0.0.2")
    assert busy.evicted is None


def test_a_keep_alive_connection_waits_from_its_last_request_not_from_its_opening() -> None:
    t = table(share=1.0)
    keep_alive, fresh = Conn("keep_alive"), Conn("fresh")
    body = Conn("body", DoorState.BODY)
    fill(t, "10.0.0.1", keep_alive, body, fresh)
    keep_alive.serve_a_request()  # opened first, but its wait began after fresh's
    assert t.make_room("10.0.0.2")
    assert (fresh.evicted, keep_alive.evicted) == (DoorState.IDLE, None)
    # Waiting, if not for long: it goes before a request whose body is under way.
    assert t.make_room("10.0.0.2")
    assert (keep_alive.evicted, body.evicted) == (DoorState.IDLE, None)


def test_a_connection_found_busy_is_not_taken_for_waiting_since_then() -> None:
    q: OrderedDict[Conn, object] = OrderedDict()
    c, d = Conn("c", DoorState.BUSY), Conn("d", DoorState.BUSY)
    q[c] = c.wait_mark()
    q[d] = d.wait_mark()
    assert choose_victim(q, 8) == (None, DoorState.GONE)
    c.state = d.state = DoorState.IDLE  # their responses ended after the search: new waits
    assert choose_victim(q, 1) == (c, DoorState.IDLE)  # waiting anew: taken if none else
    del q[c]
    assert choose_victim(q, 1) == (d, DoorState.IDLE)
    assert list(q) == [d]
    q[d] = d.wait_mark()  # looked at again after the search that marked it
    assert choose_victim(q, 1) == (d, DoorState.IDLE)


def test_the_search_is_bounded_and_moves_what_it_keeps_to_the_back() -> None:
    q: OrderedDict[Conn, object] = OrderedDict()
    busy = [Conn(f"busy{i}", DoorState.BUSY) for i in range(SEARCH_LIMIT)]
    idle = Conn("idle")
    for c in [*busy, idle]:
        q[c] = c.wait_mark()
    assert choose_victim(q, SEARCH_LIMIT) == (None, DoorState.GONE)
    assert next(iter(q)) is idle
    assert choose_victim(q, SEARCH_LIMIT) == (idle, DoorState.IDLE)


def test_an_address_over_its_share_is_closed_first() -> None:
    t = table(capacity=10, share=0.5)  # 5 each
    older = [Conn(f"b{i}") for i in range(3)]
    fill(t, "10.0.0.2", *older)
    crowd = [Conn(f"a{i}") for i in range(7)]
    fill(t, "10.0.0.1", *crowd)
    assert t.make_room("10.0.0.3")
    assert crowd[0].evicted is DoorState.IDLE
    assert all(c.evicted is None for c in older)


def test_an_address_over_its_share_takes_the_place_of_its_own_or_is_refused() -> None:
    t = table(capacity=10, share=0.5)
    others = [Conn(f"b{i}") for i in range(5)]
    fill(t, "10.0.0.2", *others)  # older, and waiting
    own = [Conn(f"a{i}") for i in range(5)]
    fill(t, "10.0.0.1", *own)
    assert t.make_room("10.0.0.1")
    assert own[0].evicted is DoorState.IDLE
    assert all(c.evicted is None for c in others)
    t.closed(own[0], "10.0.0.1")
    t.opened(Conn("a5", DoorState.BUSY), "10.0.0.1")
    for c in own[1:]:
        c.state = DoorState.BUSY
    assert not t.make_room("10.0.0.1")
    assert all(c.evicted is None for c in others)
    # Another address under its share may still take the place of a waiting one.
    assert t.make_room("10.0.0.3")
    assert others[0].evicted is DoorState.IDLE


def test_counts_per_address_follow_opens_and_closes() -> None:
    t = table(capacity=4, share=0.5)
    a, b, c = Conn("a"), Conn("b"), Conn("c")
    fill(t, "x", a, b)
    t.opened(c, "y")
    assert (t.held_by("x"), t.held_by("y"), len(t)) == (2, 1, 3)
    t.closed(a, "x")
    t.closed(b, "x")
    t.closed(b, "x")  # a second close changes nothing
    assert (t.held_by("x"), len(t)) == (0, 1)
    # Evicted, then closed: counted out once.
    assert t.make_room("z")
    assert c.evicted is DoorState.IDLE
    t.closed(c, "y")
    assert (t.held_by("y"), len(t)) == (0, 0)
    assert t.address_cap == 2
    assert ConnectionTable(3, 0.1).address_cap == 1
