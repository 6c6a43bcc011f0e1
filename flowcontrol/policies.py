"""The pluggable parts of dispatch: between the tenants of a band (`Fairness`) and inside one
tenant's queue (`Ordering`). Pure: state in plain containers, time passed in."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True, eq=False)
class Waiting:
    """A request waiting for dispatch, as the dispatch core sees it."""

    seq: int  # arrival order, unique
    tenant: str
    priority: int
    program: str | None  # x-program-id: what least-attained-service ordering groups by
    cost: int  # estimated prompt tokens
    arrived: float
    deadline: float  # when it is refused, if still waiting


class Fairness(Protocol):
    """Which tenant of a band goes next. One instance per band; told of every change."""

    name: str

    def activated(self, tenant: str) -> None:
        """`tenant` has requests waiting in this band again (or for the first time)."""

    def deactivated(self, tenant: str) -> None:
        """`tenant` has no request left waiting in this band."""

    def pick(self) -> str:
        """A tenant with requests waiting; called only while there is one."""

    def dispatched(self, tenant: str, cost: int) -> None:
        """A request of `tenant` costing `cost` prompt tokens left the queue for a backend."""


class RoundRobin:
    """A request from each waiting tenant in turn, whatever its size."""

    name = "round_robin"

    def __init__(self) -> None:
        self._turns: collections.deque[str] = collections.deque()

    def activated(self, tenant: str) -> None:
        self._turns.append(tenant)

    def deactivated(self, tenant: str) -> None:
        self._turns.remove(tenant)

    def pick(self) -> str:
        return self._turns[0]

    def dispatched(self, tenant: str, cost: int) -> None:
        turns = self._turns
        if turns and turns[0] == tenant:
            turns.rotate(-1)  # its turn is over: to the back


class TokenWeighted:
    """Equal shares of prompt tokens: the waiting tenant that has been served the fewest tokens
    goes next (start-time fair queueing). A tenant that comes back after an idle spell starts
    level with the least served waiting tenant, so idling earns no credit to burst with."""

    name = "token_weighted"

    def __init__(self) -> None:
        self._served: dict[str, int] = {}  # waiting tenants only

    def activated(self, tenant: str) -> None:
        self._served[tenant] = min(self._served.values(), default=0)

    def deactivated(self, tenant: str) -> None:
        del self._served[tenant]

    def pick(self) -> str:
        served = self._served
        return min(served, key=served.__getitem__)  # ties: the first to arrive

    def dispatched(self, tenant: str, cost: int) -> None:
        if tenant in self._served:
            self._served[tenant] += max(cost, 1)


class Ordering(Protocol):
    """Which of one tenant's waiting requests goes next. One instance for the whole proxy."""

    name: str

    def pick(self, queue: Sequence[Waiting], now: float) -> Waiting:
        """From a non-empty queue in arrival order."""

    def credit(self, program: str | None, tokens: int) -> None:
        """`tokens` were served to `program` (prompt at dispatch, output when it ends)."""

    def stats(self) -> dict[str, int]:
        """Attained service per program, for the admin view (empty when not kept)."""


class FirstComeFirstServed:
    name = "fcfs"

    def pick(self, queue: Sequence[Waiting], now: float) -> Waiting:
        return queue[0]

    def credit(self, program: str | None, tokens: int) -> None:
        return None

    def stats(self) -> dict[str, int]:
        return {}


# Programs whose attained service is remembered; the least recently served are forgotten first.
MAX_PROGRAMS = 10_000


class LeastAttainedService:
    """Autellix's program-level least attained service: the request of the program that has
    been served the fewest tokens goes first, so short agent programs are not stuck behind long
    ones. A request without a program is a program of its own that has had nothing yet. A
    request waiting longer than `starvation_threshold` goes first regardless, oldest first."""

    name = "las"

    def __init__(self, starvation_threshold: float, max_programs: int = MAX_PROGRAMS) -> None:
        self._threshold = starvation_threshold
        self._max = max_programs
        self._attained: collections.OrderedDict[str, int] = collections.OrderedDict()

    def pick(self, queue: Sequence[Waiting], now: float) -> Waiting:
        oldest = queue[0]
        if now - oldest.arrived >= self._threshold:
            return oldest  # promoted: it has waited too long
        attained = self._attained
        best = oldest
        best_service = attained.get(oldest.program, 0) if oldest.program is not None else 0
        for w in queue:
            service = attained.get(w.program, 0) if w.program is not None else 0
            if service < best_service:  # strictly less: ties keep arrival order
                best, best_service = w, service
        return best

    def credit(self, program: str | None, tokens: int) -> None:
        if program is None:
            return
        attained = self._attained
        attained[program] = attained.pop(program, 0) + tokens
        if len(attained) > self._max:
            attained.popitem(last=False)

    def stats(self) -> dict[str, int]:
        return dict(self._attained)


# The policies by the names `flow_control` configures them with: fairness built per band,
# ordering once, given the starvation threshold.
FAIRNESS: dict[str, Callable[[], Fairness]] = {
    RoundRobin.name: RoundRobin,
    TokenWeighted.name: TokenWeighted,
}
ORDERING: dict[str, Callable[[float], Ordering]] = {
    FirstComeFirstServed.name: lambda _threshold: FirstComeFirstServed(),
    LeastAttainedService.name: LeastAttainedService,
}
