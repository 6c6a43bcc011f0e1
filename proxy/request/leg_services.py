"""What the legs of every request use, built once per proxy from its services."""

from __future__ import annotations

from proxy.ports import RequestServices
from proxy.request.choosing import BackendChooser
from proxy.request.kv_legs import KvLegs
from proxy.request.upstream_opener import UpstreamOpener


class LegServices:
    __slots__ = ("chooser", "kv", "upstream")

    def __init__(self, core: RequestServices) -> None:
        self.chooser = BackendChooser(core)
        self.upstream = UpstreamOpener(core)
        self.kv = KvLegs(core, self.upstream)
