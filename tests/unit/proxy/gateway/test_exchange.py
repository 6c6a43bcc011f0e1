"""One request's exchange with the gateway, without gRPC: what the gateway is told for a pick
(the destination list, the prefill engine of a P/D pair, a rewritten body's length) and the
accounting from the pick to the answer's end."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from fleet.types import Backend, BackendSpec, Role
from proxy.gateway.exchange import Exchange
from proxy.gateway.picking import Pick
from proxy.metrics import RouterMetrics

MODEL = "m"


def engine(name: str, port: int, role: Role = Role.BOTH) -> Backend:
    return Backend(BackendSpec(id=name, url=f"http://10.0.0.1:{port}", role=role, models=(MODEL,)))


class FixedPicker:
    """Always the same pick: what the exchange makes of it is under test."""

    def __init__(self, pick: Pick) -> None:
        self.pick_ = pick

    async def pick(
        self,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        subset: Collection[str] | None,
        request_id: str,
    ) -> Pick:
        return self.pick_


def metrics() -> RouterMetrics:
    return RouterMetrics(CollectorRegistry(), lambda model: model == MODEL)


def exchange_for(pick: Pick, m: RouterMetrics | None = None) -> Exchange:
    ex = Exchange(FixedPicker(pick), m or metrics())  # type: ignore[arg-type]
    ex.path = "/v1/completions"
    return ex


async def test_a_disaggregated_pick_names_the_decode_engine_and_the_prefill_one() -> None:
    prefill, decode = engine("p", 8001, Role.PREFILL), engine("d", 8002, Role.DECODE)
    routed = await exchange_for(Pick(decode, (), prefill, "completions", MODEL, 10, None)).route(
        b"{}"
    )
    assert routed.destination == "10.0.0.1:8002"
    assert dict(routed.headers) == {
        "x-gateway-destination-endpoint": "10.0.0.1:8002",
        "x-prefiller-host-port": "10.0.0.1:8001",
    }
    assert routed.body is None


async def test_fallbacks_follow_the_primary_and_a_new_body_carries_its_length() -> None:
    a, b, c = engine("a", 1), engine("b", 2), engine("c", 3)
    body = b'{"model":"m","prompt":"x"}'
    routed = await exchange_for(Pick(a, (b, c), None, "completions", MODEL, 5, body)).route(b"")
    assert routed.destination == "10.0.0.1:1,10.0.0.1:2,10.0.0.1:3"
    assert dict(routed.headers)["x-gateway-destination-endpoint"] == routed.destination
    assert dict(routed.headers)["content-length"] == str(len(body))
    assert "x-prefiller-host-port" not in dict(routed.headers)
    assert routed.body == body


async def test_the_accounting_from_the_pick_to_the_answers_end() -> None:
    a, b = engine("a", 1), engine("b", 2)
    m = metrics()
    ex = exchange_for(Pick(a, (b,), None, "completions", MODEL, 40, None), m)
    await ex.route(b"{}")
    assert (a.load.in_flight, a.load.pending_prefill_tokens) == (1, 40)
    ex.served_by(b)  # a fallback answered
    assert (a.load.in_flight, b.load.in_flight, b.load.pending_prefill_tokens) == (0, 1, 40)
    ex.response_headers(200)
    ex.response_data()
    ex.response_data()  # only the first piece is the first token
    assert (b.load.pending_prefill_tokens, b.load.running_decodes) == (0, 1)
    ex.end(complete=True)
    ex.end()  # the stream's close after the end releases nothing twice
    assert (b.load.in_flight, b.load.running_decodes) == (0, 0)
    value: Any = m.registry.get_sample_value(
        "fleet_proxy_requests_total", {"endpoint": "completions", "model": MODEL, "status": "200"}
    )
    assert value == 1


async def test_a_stream_closed_before_the_answers_end_counts_as_499() -> None:
    a = engine("a", 1)
    m = metrics()
    ex = exchange_for(Pick(a, (), None, "completions", MODEL, 40, None), m)
    await ex.route(b"{}")
    ex.response_headers(200)
    ex.end()
    assert a.load.in_flight == 0 and a.load.pending_prefill_tokens == 0
    labels = {"endpoint": "completions", "model": MODEL, "status": "499"}
    assert m.registry.get_sample_value("fleet_proxy_requests_total", labels) == 1
