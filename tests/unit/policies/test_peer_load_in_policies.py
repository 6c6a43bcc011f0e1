"""With several worker processes, a backend loaded by the other workers only (`Load.peer_*`)
is as busy to every load-reading policy as one loaded by this worker."""

import pytest

from fleet.types import Backend
from policies.registry import build_policy
from tests.unit.policies.builders import backend, ctx


def peer_loaded(bid: str, n: int) -> Backend:
    b = backend(bid)
    b.load.peer_in_flight = n
    b.load.peer_pending_prefill_tokens = 100 * n
    return b


@pytest.mark.parametrize(
    "name", ["least_requests", "power_of_two", "lmetric", "autellix", "cache_balance"]
)
def test_a_backend_busy_in_other_workers_is_avoided(name: str) -> None:
    policy = build_policy(name)
    for _ in range(6):  # whatever rotation or sampling the policy starts from
        busy, idle = peer_loaded("busy", 5), backend("idle")
        assert policy.pick(ctx("hello", tokens=10), [busy, idle], 0.0).target is idle
        busy, idle = peer_loaded("busy", 5), backend("idle")
        assert policy.pick(ctx("hello", tokens=10), [idle, busy], 0.0).target is idle


def test_own_and_peer_load_count_alike() -> None:
    own, peers = backend("own", in_flight=3), peer_loaded("peers", 3)
    policy = build_policy("least_requests")
    # Equal totals: a tie, broken by rotation, so both get picked over a few decisions.
    picked = {policy.pick(ctx("x"), [own, peers], 0.0).target.id for _ in range(4)}
    assert picked == {"own", "peers"}
