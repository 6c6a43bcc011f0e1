"""The cost model that picks how a move carries the KV (proxy/stream/move_kinds.py)."""

import pytest

from proxy.settings import load_settings
from proxy.stream.move_kinds import MoveCosts, choose_kind, predicted_downtime, transfers_kv

COSTS = MoveCosts(
    recompute_s_per_token=1e-4, transfer_s_per_token=1e-5, kv_leg_s=0.02, precopy_min_tokens=2048
)


def test_short_sequences_recompute_long_ones_precopy_between_them_hand_over() -> None:
    # Hand-over wins once its fixed leg costs less than the prefill it saves:
    # 0.02 + 1e-5 t < 1e-4 t  <=>  t > 222.
    assert choose_kind(100, True, COSTS) == "recompute"
    assert choose_kind(222, True, COSTS) == "recompute"
    assert choose_kind(223, True, COSTS) == "handover"
    assert choose_kind(2047, True, COSTS) == "handover"
    assert choose_kind(2048, True, COSTS) == "precopy"
    assert choose_kind(100_000, True, COSTS) == "precopy"


def test_without_kv_transfer_on_both_ends_every_move_recomputes() -> None:
    for requested in ("auto", "handover", "precopy", "recompute"):
        assert choose_kind(50_000, False, COSTS, requested) == "recompute"


def test_a_forced_kind_is_used_where_both_ends_transfer() -> None:
    assert choose_kind(10, True, COSTS, "precopy") == "precopy"
    assert choose_kind(10, True, COSTS, "handover") == "handover"
    assert choose_kind(50_000, True, COSTS, "recompute") == "recompute"


def test_a_cheap_prefill_keeps_recompute_even_for_long_sequences_below_precopy() -> None:
    fast_prefill = MoveCosts(
        recompute_s_per_token=1e-6, transfer_s_per_token=1e-5, kv_leg_s=0.02,
        precopy_min_tokens=10**9,
    )  # fmt: skip
    assert choose_kind(500_000, True, fast_prefill) == "recompute"


def test_predicted_downtime_per_kind() -> None:
    assert predicted_downtime("recompute", 1000, COSTS) == pytest.approx(0.1)
    assert predicted_downtime("handover", 1000, COSTS) == pytest.approx(0.03)
    assert predicted_downtime("precopy", 1000, COSTS) == 0.0


def test_only_the_nixl_label_marks_a_backend_that_transfers_kv() -> None:
    assert transfers_kv({"kv_connector": "nixl"})
    assert not transfers_kv({})
    assert not transfers_kv({"kv_connector": "lmcache"})


def test_settings_build_the_costs_and_refuse_an_unknown_kind() -> None:
    s = load_settings({"move_kv_leg_s": 0.5, "move_precopy_min_tokens": 10})
    assert s.move_kind == "auto"
    assert s.move_costs() == MoveCosts(
        recompute_s_per_token=1e-4, transfer_s_per_token=1e-5, kv_leg_s=0.5,
        precopy_min_tokens=10,
    )  # fmt: skip
    with pytest.raises(Exception, match="move_kind"):
        load_settings({"move_kind": "teleport"})
