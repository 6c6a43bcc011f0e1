"""Envoy's external processing service (envoy.service.ext_proc.v3.ExternalProcessor) as the
Endpoint Picker Protocol uses it: one gRPC stream per HTTP request.

Envoy is configured to send the request's headers, its whole body (request_body_mode
BUFFERED), the response's headers and its body as it streams (STREAMED). The pick happens at
the body's end: the destination header and the `envoy.lb` dynamic metadata name the engines,
the body is rewritten when a model alias applies, and a request no engine fits is answered by
Envoy itself (ImmediateResponse). The response is only watched: its first bytes and its end.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from proxy.errors import ProxyError
from proxy.gateway.exchange import DESTINATION, Exchange, Routed
from proxy.gateway.picking import EndpointPicker, host_port
from proxy.gateway.usage import UsageMetrics
from proxy.metrics import RouterMetrics

log = logging.getLogger("fleet_proxy.gateway")

# Where the gateway puts the engines a request may go to, and where it is told the pick.
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"


class ExternalProcessor:
    """The servicer grpc's generated `add_ExternalProcessorServicer_to_server` takes."""

    def __init__(
        self, picker: EndpointPicker, metrics: RouterMetrics, usage: UsageMetrics | None = None
    ) -> None:
        self._metrics = metrics
        self._picker = picker
        self._usage = usage
        # The answers that say only "go on": built once, sent for most messages.
        self._go_on_headers = pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=pb.CommonResponse())
        )
        self._go_on_response_headers = pb.ProcessingResponse(
            response_headers=pb.HeadersResponse(response=pb.CommonResponse())
        )
        self._go_on_body = pb.ProcessingResponse(
            request_body=pb.BodyResponse(response=pb.CommonResponse())
        )
        self._go_on_response_body = pb.ProcessingResponse(
            response_body=pb.BodyResponse(response=pb.CommonResponse())
        )

    async def Process(  # the gRPC method's name
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        exchange = Exchange(self._picker, self._metrics)
        body: list[bytes] = []
        # The answer's two pieces before the current one, for its usage at the end (the usage
        # event, then `[DONE]`, then an empty last piece, at worst).
        older: Any = None
        previous: Any = None
        try:
            async for message in requests:
                kind = message.WhichOneof("request")
                if kind == "response_body":
                    exchange.response_data()
                    # Ended before the answer to Envoy: once it has the last answer it may close
                    # the stream, and this generator is then closed at its `yield`.
                    if message.response_body.end_of_stream:
                        if self._usage is not None:
                            self._count_usage(exchange, older, previous, message)
                        exchange.end(complete=True)
                    elif self._usage is not None:
                        older, previous = previous, message
                    yield self._go_on_response_body
                elif kind == "request_headers":
                    self._read_headers(exchange, message)
                    if message.request_headers.end_of_stream:
                        yield await self._answer(exchange, b"", phase="request_headers")
                    else:
                        yield self._go_on_headers
                elif kind == "request_body":
                    chunk = message.request_body
                    body.append(chunk.body)
                    if chunk.end_of_stream:
                        whole = b"".join(body)
                        body.clear()
                        yield await self._answer(exchange, whole, phase="request_body")
                    else:
                        yield self._go_on_body
                elif kind == "response_headers":
                    self._served(exchange, message)
                    exchange.response_headers(_status(message.response_headers.headers))
                    if message.response_headers.end_of_stream:
                        exchange.end(complete=True)
                    yield self._go_on_response_headers
                elif kind == "request_trailers":
                    yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
                elif kind == "response_trailers":
                    exchange.end(complete=True)
                    yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
        finally:
            exchange.end()

    def _count_usage(self, exchange: Exchange, *pieces: Any) -> None:
        pick = exchange.picked
        if pick is None or not pick.endpoint or self._usage is None:
            return
        tail = b"".join(p.response_body.body for p in pieces if p is not None)
        self._usage.count(pick.endpoint, pick.model, tail)

    def _read_headers(self, exchange: Exchange, message: Any) -> None:
        headers = exchange.headers
        for h in message.request_headers.headers.headers:
            headers[h.key] = h.raw_value.decode("latin-1") if h.raw_value else h.value
        exchange.path = headers.get(":path", "")
        exchange.request_id = headers.get("x-request-id", "")
        hint = message.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
        if hint is not None and SUBSET_KEY in hint.fields:
            listed = hint.fields[SUBSET_KEY].list_value.values
            exchange.subset = frozenset(v.string_value for v in listed)

    def _served(self, exchange: Exchange, message: Any) -> None:
        """Which engine answered, when the gateway says (it tried a fallback)."""
        lb = message.metadata_context.filter_metadata.get(LB_NAMESPACE)
        if lb is None or SERVED_KEY not in lb.fields:
            return
        served = lb.fields[SERVED_KEY].string_value
        pick = exchange.picked
        if pick is None:
            return
        for backend in (pick.target, *pick.fallbacks):
            if host_port(backend) == served:
                exchange.served_by(backend)
                return

    async def _answer(self, exchange: Exchange, body: bytes, *, phase: str) -> Any:
        try:
            routed = await exchange.route(body)
        except ProxyError as e:
            return _immediate(e)
        except Exception:
            # Never a broken stream for a fault of the picker's: the gateway answers 500.
            log.exception("picking for %s failed", exchange.request_id or exchange.path)
            return _immediate(
                ProxyError(500, "internal endpoint picker error", type="internal_error")
            )
        return _routing_answer(routed, phase)


def _routing_answer(routed: Routed, phase: str) -> Any:
    common = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(
            set_headers=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=k, raw_value=v.encode("latin-1")),
                    append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                )
                for k, v in routed.headers
            ]
        ),
        # The route was chosen before the destination header was set: choose it again, so a
        # route that matches on the header sees it.
        clear_route_cache=True,
    )
    if routed.body is not None:
        common.body_mutation.body = routed.body
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION: routed.destination}})
    if phase == "request_headers":
        return pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
        )
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata
    )


def _immediate(error: ProxyError) -> Any:
    headers = [("content-type", "application/json")]
    if error.status in (429, 503):
        headers.append(("retry-after", "1"))
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.status),
            headers=pb.HeaderMutation(
                set_headers=[
                    base_pb2.HeaderValueOption(
                        header=base_pb2.HeaderValue(key=k, raw_value=v.encode("latin-1"))
                    )
                    for k, v in headers
                ]
            ),
            body=error.body(),
            details=error.message,
        )
    )


def _status(headers: Any) -> int:
    for h in headers.headers:
        if h.key == ":status":
            value = h.raw_value.decode("latin-1") if h.raw_value else h.value
            return int(value) if value.isdigit() else 0
    return 0
