"""The loop in SLA mode: counter snapshots from a fake proxy drive the connector."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fleet.clock import FakeClock
from fleet.types import Role
from planner.config import PlannerConfig, PlannerMode, PlannerRole, PredictorKind
from planner.connector import FakeConnector
from planner.decide import Reason
from planner.loop import PlannerLoop
from planner.sla_mode import SlaDecider
from planner.traffic import RequestCounters
from tests.unit.planner.fake_admin import FakeAdmin
from tests.unit.planner.test_sla_decide import PROFILES

CONFIG = PlannerConfig(
    metric_pulling_interval=1.0,
    adjustment_interval=2.0,
    mode=PlannerMode.SLA,
    ttft_target=0.5,
    itl_target=0.03,
    sla_profile="given-to-the-loop",
    load_predictor=PredictorKind.MOVING_AVERAGE,
)


def finish(admin: FakeAdmin, requests: float) -> None:
    """`requests` more finish on every decode-side backend, each 1000 prompt and 100 output
    tokens at the profile's ITL (0.02 s at 10 in flight: no correction)."""
    for b in list(admin.backends_by_id.values()):
        if b.role is Role.PREFILL:
            continue
        c = b.counters or RequestCounters()
        admin.backends_by_id[b.id] = dataclasses.replace(
            b,
            running=10.0,
            counters=dataclasses.replace(
                c,
                requests_finished=c.requests_finished + requests,
                prompt_len_sum=c.prompt_len_sum + 1000 * requests,
                prompt_len_count=c.prompt_len_count + requests,
                output_len_sum=c.output_len_sum + 100 * requests,
                output_len_count=c.output_len_count + requests,
                itl_sum=c.itl_sum + 0.02 * 100 * requests,
                itl_count=c.itl_count + 100 * requests,
            ),
        )


async def test_counter_snapshots_scale_toward_the_sla_targets() -> None:
    clock = FakeClock(0.0)
    admin = FakeAdmin()
    admin.add("d0", Role.DECODE)
    connector = FakeConnector({PlannerRole.PREFILL: 1, PlannerRole.DECODE: 1})
    loop = PlannerLoop(admin, connector, CONFIG, clock=clock, profiles=PROFILES)
    assert isinstance(loop.decider, SlaDecider)
    await loop.start()
    finish(admin, 0)  # the counters' first reading
    for _ in range(2):
        clock.advance(1.0)
        await loop.tick()
        finish(admin, 10)  # 10 requests/s
    # Pulls at 1 s and 2 s: 10 requests in 1 s. Targets: prefill 3, decode 2 (see
    # test_sla_decide); one step each.
    assert connector.calls == [(PlannerRole.PREFILL, 2), (PlannerRole.DECODE, 2)]
    last = loop.decisions()[-1].decision
    assert last.sla is not None and last.sla.forecast.rate == 10.0
    assert last.sla.itl_correction == pytest.approx(1.0)
    assert [r.reason for r in last.roles] == [Reason.SLA_UP, Reason.SLA_UP]


async def test_sla_mode_reads_the_profile_file(tmp_path: Path) -> None:
    missing = dataclasses.replace(CONFIG, sla_profile=str(tmp_path / "none.json"))
    with pytest.raises(ValueError, match="not a usable SLA profile"):
        PlannerLoop(FakeAdmin(), FakeConnector(), missing)


def test_the_profile_must_match_the_engines_gpus() -> None:
    tp2 = dataclasses.replace(PROFILES, decode_num_gpu=2, decode_config="tp2")
    with pytest.raises(ValueError, match=r"decode_engine_num_gpu is 1 but .* 'tp2' uses 2"):
        PlannerLoop(FakeAdmin(), FakeConnector(), CONFIG, profiles=tp2)
