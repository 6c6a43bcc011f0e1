"""The picker's ext_proc stream spoken to directly over gRPC, as Envoy speaks it: the answers'
exact shape (headers, `envoy.lb` metadata, body mutation, ImmediateResponse) for the cases a
test through Envoy cannot see or set up easily. Simulated engines on real ports."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proxy.gateway.objectives import FixedPriorities
from proxy.gateway.options import EppOptions
from proxy.gateway.shedding import Shedding
from proxy.serving.epp import RunningEpp, running_epp
from simulator.fleet import SimFleet, start_fleet
from tests.integration.test_pd_disaggregation import pd_routing
from tests.support.polling import eventually
from tests.support.processes import free_port
from tests.support.servers import fast_settings

MODEL = "sim-llama-8b"


@contextlib.asynccontextmanager
async def picker(
    urls: list[Any], options: EppOptions | None = None, **settings: Any
) -> AsyncIterator[tuple[Any, RunningEpp]]:
    async with running_epp(fast_settings(urls, **settings), options or EppOptions(port=0)) as epp:
        core = epp.core
        await eventually(
            lambda: len(core.fleet.routable(core.clock.now())) == len(urls),
            within=30,
            what="the picker's engines scraped",
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.port}") as channel:
            yield pb_grpc.ExternalProcessorStub(channel), epp


def headers_message(
    path: str, *, end: bool = False, subset: list[str] | None = None, **extra: str
) -> Any:
    values = {":method": "POST" if not end else "GET", ":path": path, **extra}
    message = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()
                ]
            ),
            end_of_stream=end,
        )
    )
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({"x-gateway-destination-endpoint-subset": subset})
        message.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return message


def body_message(body: dict[str, Any]) -> Any:
    return pb.ProcessingRequest(
        request_body=pb.HttpBody(body=orjson.dumps(body), end_of_stream=True)
    )


async def exchange(stub: Any, *messages: Any) -> list[Any]:
    """Send `messages` on one stream, one answer read after each."""
    call = stub.Process()
    answers = []
    for m in messages:
        await call.write(m)
        answers.append(await call.read())
    await call.done_writing()
    return answers


async def pick_once(port: int, body: dict[str, Any]) -> Any:
    """The picker's answer on 127.0.0.1:`port` to a completion with `body`, on a stream of
    its own."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        _, answer = await exchange(stub, headers_message("/v1/completions"), body_message(body))
    return answer


def set_headers(common: Any) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def destination_metadata(answer: Any) -> str:
    value: str = (
        answer.dynamic_metadata.fields["envoy.lb"]
        .struct_value.fields["x-gateway-destination-endpoint"]
        .string_value
    )
    return value


def host_port(url: str) -> str:
    return url.removeprefix("http://")


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(3, speed=20.0) as f:
        yield f


async def test_the_pick_is_in_the_header_and_the_metadata_with_fallbacks(
    fleet: SimFleet,
) -> None:
    async with picker(fleet.urls, EppOptions(port=0, fallbacks=2)) as (stub, epp):
        first, second = await exchange(
            stub,
            headers_message("/v1/completions"),
            body_message({"model": MODEL, "prompt": "hello", "max_tokens": 2}),
        )
        assert first.WhichOneof("response") == "request_headers"
        common = second.request_body.response
        listed = set_headers(common)["x-gateway-destination-endpoint"]
        assert listed == destination_metadata(second)
        engines = listed.split(",")
        assert sorted(engines) == sorted(host_port(u) for u in fleet.urls)
        assert not common.body_mutation.body  # no alias: the body goes on as sent
        # The stream ended with no answer observed: its request released.
        await eventually(
            lambda: sum(b.load.in_flight for b in epp.core.fleet) == 0, what="released"
        )


async def test_the_subset_hint_limits_the_pick_and_an_empty_one_is_a_503(
    fleet: SimFleet,
) -> None:
    allowed = host_port(fleet.urls[2])
    async with picker(fleet.urls, policy="round_robin") as (stub, _):
        for _ in range(3):
            _, answer = await exchange(
                stub,
                headers_message("/v1/completions", subset=[allowed]),
                body_message({"model": MODEL, "prompt": "hello", "max_tokens": 2}),
            )
            assert destination_metadata(answer) == allowed
        _, refused = await exchange(
            stub,
            headers_message("/v1/completions", subset=["10.0.0.1:8000"]),
            body_message({"model": MODEL, "prompt": "hello", "max_tokens": 2}),
        )
        assert refused.immediate_response.status.code == 503
        assert orjson.loads(refused.immediate_response.body)["error"]["code"] == 503


async def test_a_request_without_a_body_goes_to_the_least_busy_engine(fleet: SimFleet) -> None:
    async with picker(fleet.urls) as (stub, _):
        (answer,) = await exchange(stub, headers_message("/v1/models", end=True))
        picked = set_headers(answer.request_headers.response)["x-gateway-destination-endpoint"]
        assert picked in {host_port(u) for u in fleet.urls}


async def test_an_alias_rewrites_the_body_and_its_length() -> None:
    async with (
        await start_fleet(1, speed=20.0) as fleet,
        picker(fleet.urls, model_aliases={"house": MODEL}) as (stub, _),
    ):
        _, answer = await exchange(
            stub,
            headers_message("/v1/chat/completions"),
            body_message({"model": "house", "messages": [{"role": "user", "content": "hi"}]}),
        )
        common = answer.request_body.response
        body = common.body_mutation.body
        assert orjson.loads(body)["model"] == MODEL
        assert set_headers(common)["content-length"] == str(len(body))


async def test_disaggregated_requests_name_the_prefill_engine_for_the_decode_sidecar() -> None:
    async with await start_fleet(2, role=["prefill", "decode"], speed=20.0) as fleet:
        prefill, decode = fleet.urls
        backends = [{"url": prefill, "role": "prefill"}, {"url": decode, "role": "decode"}]
        async with picker(backends, routing=pd_routing()) as (stub, _):
            _, answer = await exchange(
                stub,
                headers_message("/v1/completions"),
                body_message({"model": MODEL, "prompt": "a long prompt " * 50, "max_tokens": 2}),
            )
            headers = set_headers(answer.request_body.response)
            assert headers["x-gateway-destination-endpoint"] == host_port(decode)
            assert headers["x-prefiller-host-port"] == host_port(prefill)


async def test_a_sheddable_request_gets_429_when_every_engine_is_saturated(
    fleet: SimFleet,
) -> None:
    # A queue depth of 0: every engine counts as saturated, whatever its load.
    shedding = Shedding(queue_depth=0, priorities=FixedPriorities({"batch": -1, "chat": 10}))
    async with picker(fleet.urls, EppOptions(port=0, shedding=shedding)) as (stub, _):
        body = body_message({"model": MODEL, "prompt": "hello", "max_tokens": 2})
        for objective, shed in (("batch", True), ("chat", False), ("unnamed", False)):
            headers = headers_message(
                "/v1/completions", **{"x-gateway-inference-objective": objective}
            )
            _, answer = await exchange(stub, headers, body)
            if shed:
                assert answer.immediate_response.status.code == 429
            else:
                assert answer.WhichOneof("response") == "request_body"


async def test_the_accounting_follows_the_answer_and_a_closed_stream_releases_it(
    fleet: SimFleet,
) -> None:
    async with picker(fleet.urls) as (stub, epp):
        call = stub.Process()
        await call.write(headers_message("/v1/completions"))
        await call.read()
        await call.write(
            body_message({"model": MODEL, "prompt": "hello " * 40, "max_tokens": 2, "stream": True})
        )
        answer = await call.read()
        target = destination_metadata(answer)
        backend = next(b for b in epp.core.fleet if host_port(b.url) == target)
        assert backend.load.in_flight == 1 and backend.load.pending_prefill_tokens > 0
        await call.write(
            pb.ProcessingRequest(
                response_headers=pb.HttpHeaders(
                    headers=base_pb2.HeaderMap(
                        headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")]
                    )
                )
            )
        )
        await call.read()
        await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: {}\n\n")))
        await call.read()
        # The first output: the prompt is no longer pending, the request decodes.
        assert backend.load.pending_prefill_tokens == 0 and backend.load.running_decodes == 1
        call.cancel()  # the gateway gave up on the request before its end
        await eventually(lambda: backend.load.in_flight == 0, what="the request released")
        assert backend.load.running_decodes == 0
        labels = {"endpoint": "completions", "model": MODEL, "status": "499"}
        assert epp.core.prom.get_sample_value("fleet_proxy_requests_total", labels) == 1


async def health_of(port: int, service: str) -> int | None:
    """The service's status; None while the picker has not published it."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND
            return None
        status: int = reply.status
        return status


async def test_the_health_services_say_whether_the_picker_can_pick(fleet: SimFleet) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    async with picker(fleet.urls) as (_, epp):
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):

            async def serves(service: str = service) -> bool:
                return await health_of(epp.port, service) == serving

            await eventually(serves, what=f"{service} SERVING")
    # No engine answers: alive, not ready.
    dead = f"http://127.0.0.1:{free_port()}"
    async with running_epp(fast_settings([dead]), EppOptions(port=0)) as epp:
        assert await health_of(epp.port, "liveness") == serving

        async def not_ready() -> bool:
            return await health_of(epp.port, "readiness") == not_serving

        await eventually(not_ready, what="readiness NOT_SERVING")


async def test_the_served_endpoint_the_gateway_reports_takes_the_accounting(
    fleet: SimFleet,
) -> None:
    """After a fallback, the data plane names the engine that served (`envoy.lb` /
    `x-gateway-destination-endpoint-served`): the request counts there, not on the primary."""
    async with picker(fleet.urls, EppOptions(port=0, fallbacks=1)) as (stub, epp):
        call = stub.Process()
        await call.write(headers_message("/v1/completions"))
        await call.read()
        await call.write(body_message({"model": MODEL, "prompt": "hello", "max_tokens": 2}))
        primary, fallback = destination_metadata(await call.read()).split(",")
        by_address = {host_port(b.url): b for b in epp.core.fleet}
        assert by_address[primary].load.in_flight == 1
        served = pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(
                headers=base_pb2.HeaderMap(
                    headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")]
                )
            )
        )
        lb = struct_pb2.Struct()
        lb.update({"x-gateway-destination-endpoint-served": fallback})
        served.metadata_context.filter_metadata["envoy.lb"].CopyFrom(lb)
        await call.write(served)
        await call.read()
        assert by_address[primary].load.in_flight == 0
        assert by_address[fallback].load.in_flight == 1
        await call.write(
            pb.ProcessingRequest(response_body=pb.HttpBody(body=b"{}", end_of_stream=True))
        )
        await call.read()
        await call.done_writing()
        await eventually(
            lambda: all(b.load.in_flight == 0 for b in epp.core.fleet), what="released"
        )
