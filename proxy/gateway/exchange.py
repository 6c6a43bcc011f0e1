"""One HTTP request as the gateway's ext_proc stream shows it, from its request headers to its
response's end: the pick at the request's end, then the proxy's accounting of the request on
the engine it went to (in flight, pending prefill, decoding), released exactly once.

Protocol-free: the gRPC servicer (proxy/gateway/ext_proc.py) turns Envoy's messages into these
calls and the results into Envoy's answers.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

from fleet.types import Backend
from proxy.backends.accounting import Dispatch
from proxy.errors import ProxyError
from proxy.gateway.picking import EndpointPicker, Pick, host_port
from proxy.metrics import RouterMetrics

# What the gateway reads the picked engines from (the Endpoint Picker Protocol's names).
DESTINATION = "x-gateway-destination-endpoint"
# The prefill engine of a disaggregated request, for llm-d's routing sidecar on the decode one.
PREFILLER = "x-prefiller-host-port"


@dataclass(frozen=True, slots=True)
class Routed:
    """What the gateway is told for a picked request."""

    destination: str  # primary, then fallbacks, comma-separated ip:port
    headers: tuple[tuple[str, str], ...]  # request headers to set
    body: bytes | None  # the body to send on instead, when it changed


class Exchange:
    __slots__ = (
        "_answered",
        "_arrived",
        "_dispatch",
        "_ended",
        "_metrics",
        "_pick",
        "_picker",
        "_status",
        "headers",
        "path",
        "request_id",
        "subset",
    )

    def __init__(self, picker: EndpointPicker, metrics: RouterMetrics) -> None:
        self._picker = picker
        self._metrics = metrics
        self._arrived = time.perf_counter()
        self._pick: Pick | None = None
        self._dispatch: Dispatch | None = None
        self._answered = False
        self._ended = False
        self._status = 0
        self.headers: dict[str, str] = {}
        self.path = ""
        self.request_id = ""
        self.subset: Collection[str] | None = None

    @property
    def picked(self) -> Pick | None:
        return self._pick

    async def route(self, body: bytes) -> Routed:
        """Pick for the request whose headers were read and whose whole body is `body`; raises
        ProxyError with the status to answer instead."""
        try:
            pick = await self._picker.pick(
                self.path, self.headers, body, self.subset, self.request_id
            )
        except ProxyError as e:
            self._metrics.count_request(_endpoint_of(self.path), e.status)
            self._ended = True
            raise
        self._pick = pick
        if pick.endpoint:
            self._dispatch = Dispatch(pick.target.load, pick.charged_tokens)
        return _routed(pick)

    def served_by(self, backend: Backend) -> None:
        """The gateway says another engine than the primary served the request (a fallback):
        its accounting moves there."""
        pick = self._pick
        dispatch = self._dispatch
        if pick is None or dispatch is None or backend is pick.target:
            return
        dispatch.move(backend.load, dispatch.pending)

    def response_headers(self, status: int) -> None:
        self._status = status

    def response_data(self) -> None:
        """A piece of the answer reached the gateway: the first one is the first token of a
        stream (for an answer sent whole, the end of its prefill too)."""
        if self._answered:
            return
        self._answered = True
        dispatch = self._dispatch
        pick = self._pick
        if dispatch is None or pick is None:
            return
        dispatch.first_token()
        self._metrics.observe_ttft(pick.endpoint, pick.model, time.perf_counter() - self._arrived)

    def end(self, *, complete: bool = False) -> None:
        """The request is over, however it ended: `complete`, its answer's end reached the
        gateway; else the stream closed before it. Idempotent."""
        if self._ended:
            return
        self._ended = True
        dispatch = self._dispatch
        if dispatch is not None:
            dispatch.release()
        pick = self._pick
        if pick is None:
            return
        # 499: the gateway closed the stream before the answer's end (its client left).
        status = self._status if complete else 499
        self._metrics.count_request(pick.endpoint or _endpoint_of(self.path), status, pick.model)
        if pick.endpoint:
            self._metrics.observe_duration(
                pick.endpoint, pick.model, time.perf_counter() - self._arrived
            )


def _routed(pick: Pick) -> Routed:
    destination = ",".join(host_port(b) for b in (pick.target, *pick.fallbacks))
    headers: list[tuple[str, str]] = [(DESTINATION, destination)]
    if pick.prefill is not None:
        headers.append((PREFILLER, host_port(pick.prefill)))
    if pick.body is not None:
        headers.append(("content-length", str(len(pick.body))))
    return Routed(destination, tuple(headers), pick.body)


def _endpoint_of(path: str) -> str:
    """The metrics' endpoint label of a path that no pick named."""
    return path.split("?", 1)[0].removeprefix("/v1/") or "other"
