"""What the legs of every request use, built once per proxy from its services."""

from __future__ import annotations

from proxy.ports import RequestServices
from proxy.request.choosing import BackendChooser
from proxy.request.kv_legs import KvLegs
from proxy.request.upstream_targets import UpstreamTargets


class LegServices:
    __slots__ = ("chooser", "kv", "targets")

    def __init__(self, core: RequestServices) -> None:
        self.chooser = BackendChooser(core)
        self.targets = UpstreamTargets(core.fleet)
        self.kv = KvLegs(core, self.targets)
