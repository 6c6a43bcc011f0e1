from fleet.live import LiveTable
from fleet.types import Backend, BackendSpec, EngineMetrics, Load, MetricsSnapshot, Role
from rescheduler.observe import cluster_view, recent_itl
from rescheduler.view import InferType
from rescheduler.wire import view_from_json, view_to_json
from tests.unit.rescheduler.fakes import FakeEntry


def backend(
    bid: str, role: Role = Role.BOTH, labels: dict[str, str] | None = None, **kw: object
) -> Backend:
    spec = BackendSpec(id=bid, url=f"http://127.0.0.1:1/{bid}", role=role, node=f"n-{bid}",
                       unit="u1", labels=labels or {})  # fmt: skip
    b = Backend(spec)
    for k, v in kw.items():
        setattr(b, k, v)
    return b


def snap(at: float, itl_sum: float, itl_count: float, **m: float) -> MetricsSnapshot:
    return MetricsSnapshot(at, EngineMetrics(itl_sum=itl_sum, itl_count=itl_count, **m))  # type: ignore[arg-type]


def test_instances_map_role_state_labels_and_metrics() -> None:
    p = backend("p", Role.PREFILL, {"prefill_reserved": "true"})
    d = backend("d", Role.DECODE, draining=True)
    n = backend("n", Role.BOTH, ejected_until=200.0)
    sick = backend("s", healthy=False)
    n.load = Load(pending_prefill_tokens=30, peer_pending_prefill_tokens=12)
    n.previous_snapshot = snap(99.8, 1.0, 10)
    n.snapshot = MetricsSnapshot(
        100.0,
        EngineMetrics(running=3, waiting=2, kv_usage=0.4, itl_sum=1.5, itl_count=20,
                      block_size=16, num_gpu_blocks=100),
    )  # fmt: skip
    view = cluster_view([p, d, n, sick], [], now=150.0)
    assert view.taken_at == 150.0
    vp, vd, vn, vs = view.instances
    assert (vp.infer_type, vd.infer_type, vn.infer_type) == (
        InferType.PREFILL, InferType.DECODE, InferType.NEUTRAL,
    )  # fmt: skip
    assert vp.prefill_reserved and not vd.prefill_reserved
    assert vp.schedulable and not vd.schedulable and not vn.schedulable and not vs.schedulable
    assert vp.scraped_at is None and vp.recent_itl_s is None
    assert vn.scraped_at == 100.0 and vn.node == "n-n" and vn.unit == "u1"
    assert (vn.num_running, vn.num_waiting, vn.kv_usage) == (3, 2, 0.4)
    assert vn.capacity_tokens == 1600
    assert vn.recent_itl_s == 0.05  # 0.5 s over 10 tokens
    assert vn.pending_prefill_tokens == 42  # every worker's charge
    # Ejection over: schedulable again.
    assert cluster_view([n], [], now=201.0).instances[0].schedulable


def test_recent_itl_is_none_without_new_tokens_or_after_a_restart() -> None:
    assert recent_itl(None, snap(1, 1, 1)) is None
    assert recent_itl(snap(1, 1.0, 10), snap(2, 1.0, 10)) is None
    assert recent_itl(snap(1, 5.0, 100), snap(2, 0.1, 2)) is None  # counters fell
    itl = recent_itl(snap(1, 1.0, 10), snap(2, 1.3, 13))
    assert itl is not None and abs(itl - 0.1) < 1e-9


def test_requests_are_grouped_by_backend_and_named_by_upstream_id() -> None:
    live = LiveTable()
    a1 = FakeEntry("same", "a", "up-1", arrived_at=5.0, tokens_generated=7)
    a2 = FakeEntry("same", "a", "up-2", running=False, not_movable="move_limit")
    between = FakeEntry("x", "", "up-3")  # between legs: on no backend
    gone = FakeEntry("y", "removed", "up-4")  # its backend left the fleet
    for e in (a1, a2, between, gone):
        live.add(e)
    view = cluster_view([backend("a"), backend("b")], live, now=10.0)
    va, vb = view.instances
    assert vb.requests == ()
    assert [r.key for r in va.requests] == ["up-1", "up-2"]
    r1, r2 = va.requests
    assert r1.request_id == "same" and r1.arrived_at == 5.0
    assert (r1.charged_prompt_tokens, r1.generated_tokens, r1.tokens) == (10, 7, 17)
    assert r1.running and r1.movable
    assert not r2.running and not r2.movable


def test_the_view_survives_json() -> None:
    live = LiveTable()
    live.add(FakeEntry("r", "a", "up-1"))
    b = backend("a", Role.DECODE)
    b.snapshot = snap(3.0, 0.0, 0.0, kv_usage=0.5)
    view = cluster_view([b], live, now=4.0)
    assert view_from_json(view_to_json(view)) == view
