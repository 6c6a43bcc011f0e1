"""The saturation detector (llm-d's defaults) and who-is-asking, as pure functions."""

from __future__ import annotations

import math

import pytest

from flowcontrol.config import FlowControlConfig, SaturationConfig
from flowcontrol.identity import Identify
from flowcontrol.saturation import (
    EndpointSignals,
    SaturationThresholds,
    endpoint_load,
    free_seats,
    pool_saturation,
    saturated,
)

T = SaturationThresholds()


def signals(waiting: float = 0, running: float = 0, kv: float = 0.0, age: float = 0.05,
            in_flight: int = 0) -> EndpointSignals:  # fmt: skip
    return EndpointSignals(waiting, running, kv, age, in_flight)


def test_llm_d_defaults_queue_5_kv_0_8_staleness_200ms() -> None:
    assert (T.queue_depth, T.kv_cache_util, T.metrics_staleness) == (5, 0.8, 0.2)
    # The setting's staleness is counted past the proxy's own scrape interval.
    assert SaturationConfig.model_validate({}).thresholds(0.2) == SaturationThresholds(
        5, 0.8, 0.2 + 0.2
    )


def test_an_endpoint_has_room_below_both_thresholds() -> None:
    assert not saturated([signals(waiting=4, kv=0.79)], T)
    assert saturated([signals(waiting=5)], T)
    assert saturated([signals(kv=0.8)], T)


def test_a_stale_scrape_counts_as_no_room() -> None:
    assert endpoint_load(signals(age=0.21), T) == math.inf
    assert saturated([signals(age=0.21)], T)


def test_requests_sent_but_not_yet_scraped_count_as_waiting() -> None:
    # The scrape shows 1 running; the proxy has sent 6 more since.
    assert saturated([signals(running=1, in_flight=7)], T)
    assert not saturated([signals(running=1, in_flight=5)], T)


def test_a_queue_at_the_scrape_moves_with_the_requests_sent_or_ended_since() -> None:
    # The scrape: 4 running, 5 waiting (a full queue), while the proxy had 9 requests there.
    at_scrape = {"waiting": 5, "running": 4, "in_flight_at_scrape": 9}
    assert saturated([EndpointSignals(**at_scrape, kv_usage=0, scrape_age=0, in_flight=9)], T)
    # One of them ended: its seat went to the queue's head, which is 4 long now.
    assert not saturated([EndpointSignals(**at_scrape, kv_usage=0, scrape_age=0, in_flight=8)], T)
    # Two more were sent there since: the queue is longer than the scrape says.
    assert (
        endpoint_load(EndpointSignals(**at_scrape, kv_usage=0, scrape_age=0, in_flight=11), T)
        == 7 / 5
    )
    # Without the count at the scrape, only what the engine cannot have seen is added.
    assert endpoint_load(signals(waiting=5, running=4, in_flight=8), T) == 1.0


def test_the_pool_is_saturated_only_when_no_endpoint_has_room() -> None:
    full, free = signals(waiting=9), signals(waiting=1)
    assert not saturated([full, free], T)
    assert saturated([full, full], T)
    assert saturated([], T)
    assert pool_saturation([full, free], T) == 1 / 5


SEATS = SaturationThresholds(seats=4)


def test_with_the_engines_seats_known_an_endpoint_has_room_only_while_one_is_free() -> None:
    # The queue-depth threshold no longer lets requests wait in the engine.
    assert endpoint_load(signals(running=3, in_flight=3), SEATS) == 3 / 4
    assert saturated([signals(running=4, in_flight=4)], SEATS)
    # Sent since the scrape and not shown running yet: they hold seats all the same.
    assert saturated([signals(running=1, in_flight=4)], SEATS)
    # Another client's requests the scrape showed take seats too.
    other = EndpointSignals(0, 3, 0.0, 0.05, in_flight=1, in_flight_at_scrape=1)
    assert endpoint_load(other, SEATS) == 3 / 4
    # A queue the engine showed is still there until as many requests ended as waited.
    queue = {"waiting": 1, "running": 4, "kv_usage": 0.0, "scrape_age": 0.0}
    assert endpoint_load(EndpointSignals(**queue, in_flight=5, in_flight_at_scrape=5), SEATS) == (
        math.inf
    )
    assert not saturated([EndpointSignals(**queue, in_flight=3, in_flight_at_scrape=5)], SEATS)
    # The KV threshold and staleness apply as before.
    assert saturated([signals(kv=0.8)], SEATS)
    assert saturated([signals(age=0.21)], SEATS)
    assert SaturationConfig.model_validate({"max_num_seqs": 4}).thresholds(0.2).seats == 4


def test_free_seats_are_the_seats_an_endpoint_has_left() -> None:
    assert free_seats(endpoint_load(signals(running=1, in_flight=1), SEATS), SEATS) == 3
    assert free_seats(endpoint_load(signals(running=4, in_flight=4), SEATS), SEATS) == 0
    assert free_seats(math.inf, SEATS) == 0  # a stale scrape: none known free
    assert free_seats(0.5, T) == 0  # seats unknown: none counted


def test_seats_are_kept_only_with_fair_share_preemption_and_the_engines_seats() -> None:
    ok = {"fair_share_preemption": True, "saturation": {"max_num_seqs": 4}}
    assert FlowControlConfig.model_validate({**ok, "fair_share_reserved_seats": 1})
    for missing in ("fair_share_preemption", "saturation"):
        config = {k: v for k, v in ok.items() if k != missing}
        with pytest.raises(ValueError, match="fair_share_reserved_seats needs"):
            FlowControlConfig.model_validate({**config, "fair_share_reserved_seats": 1})


def ident(**config: object) -> Identify:
    return Identify(FlowControlConfig.model_validate(config))


def test_tenant_from_the_key_then_the_header_then_default() -> None:
    who = ident()
    assert who({"x-gateway-fairness-id": "team-a"}, "from-key").tenant == "from-key"
    assert who({"x-gateway-fairness-id": "team-a"}, None).tenant == "team-a"
    assert who({}, None).tenant == "default"
    assert who({"x-gateway-fairness-id": "  "}, None).tenant == "default"
    assert ident(fairness_header="X-Org")({"x-org": "o"}, None).tenant == "o"


def test_priority_from_an_objective_a_number_or_the_tenants_default() -> None:
    who = ident(objectives={"critical": 10, "batch": -1}, tenant_priorities={"bulk": -5})
    assert who({"x-gateway-inference-objective": "critical"}, None).priority == 10
    assert who({"x-gateway-inference-objective": "batch"}, None).sheddable
    assert who({"x-gateway-priority": "-3"}, None).priority == -3
    assert who({"x-gateway-inference-objective": "7"}, None).priority == 7
    assert who({"x-gateway-inference-objective": "unknown"}, None).priority == 0
    assert who({"x-gateway-priority": "high"}, "bulk").priority == -5
    assert who({}, None).priority == 0
