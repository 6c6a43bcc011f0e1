"""Contracts of the Filter -> Score -> Pick framework and the per-request state.

Every plugin carries its type (the registry key) and its instance name (from config):
`PluginBase`, or `SeededPlugin` for one that draws random numbers.

A scheduling profile runs its filters in order, sums `weight x score` over its scorers (each
score in [0, 1], higher is better) and hands the totals to one picker. A profile handler
decides which profiles run and turns their picks into a `Decision`. A whole algorithm (LMetric,
the hybrid, Autellix) is a picker that looks at backend state itself.

A plugin's optional hooks are the small protocols at the end (`PickObserver`,
`BackendObserver`, `ProgramKeeper`, `MetricsUser`, `StatsReporter`): the scheduler checks each
plugin against them once, when it is built, and keeps the bound hooks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry

from fleet.precise_prefix import (
    DEFAULT_MAX_BLOCKS_PER_BACKEND,
    DEFAULT_WARMUP_S,
    NO_MATCH,
    PreciseMatch,
    PrecisePrefixIndex,
)
from fleet.prefix import PrefixIndex, PrefixMatch
from fleet.types import Backend
from policies.latency import LatencyCycle
from policies.policy import Decision, RequestContext

_NO_MATCH = PrefixMatch(0, MappingProxyType({}), 1)  # read-only: shared by every request

# (extension point, plugin type, plugin name, seconds) -> None: plugin latency sink.
PluginTimer = Callable[[str, str, str, float], None]


class PluginBase:
    type = ""

    def __init__(self, name: str = "") -> None:
        self.name = name or self.type


class SeededPlugin(PluginBase):
    """A plugin that draws random numbers; `seed` makes it reproducible (None: from the OS)."""

    def __init__(self, seed: int | None = None, name: str = "") -> None:
        super().__init__(name)
        self._rng = random.Random(seed)


class RoutingServices:
    """What plugins of one routing configuration share: the prefix index, built on first use
    so that configurations without prefix-aware plugins never hash prompts; and the precise
    index of the engines' KV-cache events, which the proxy feeds and for which it tokenizes
    prompts only when some plugin (or the configuration) asked for it."""

    def __init__(
        self,
        chars_per_block: int,
        default_capacity_blocks: int,
        max_blocks: int | None = None,
        auto_capacity: bool = True,
        precise_max_blocks: int = DEFAULT_MAX_BLOCKS_PER_BACKEND,
        precise_warmup_s: float = DEFAULT_WARMUP_S,
    ) -> None:
        self._chars_per_block = chars_per_block
        self._default_capacity = default_capacity_blocks
        # Only the prompt's first max_blocks blocks are hashed and matched (None: all).
        self.max_blocks = max_blocks
        # Size each backend's LRU from its published cache config, not the default.
        self.auto_capacity = auto_capacity
        self._precise_max_blocks = precise_max_blocks
        self._precise_warmup_s = precise_warmup_s
        self.prefix_index: PrefixIndex | None = None
        self.precise_index: PrecisePrefixIndex | None = None

    def use_prefix_index(self) -> PrefixIndex:
        if self.prefix_index is None:
            self.prefix_index = PrefixIndex(self._chars_per_block, self._default_capacity)
        return self.prefix_index

    def use_precise_index(self) -> PrecisePrefixIndex:
        if self.precise_index is None:
            self.precise_index = PrecisePrefixIndex(
                self._precise_max_blocks, self._precise_warmup_s
            )
        return self.precise_index


@dataclass(slots=True)
class SchedulingRequest:
    """One scheduling cycle: the request, the clock reading and values computed once per cycle."""

    ctx: RequestContext
    now: float
    services: RoutingServices
    explain: bool = False
    receipt: dict[str, dict[str, float]] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    timer: PluginTimer | None = None
    # Latency predictions and the SLO, made by the first latency-aware plugin to ask.
    latency: LatencyCycle | None = None
    _hashes: list[int] | None = None
    _match: PrefixMatch | None = None
    _uncached: dict[str, int] | None = None
    _precise: PreciseMatch | None = None

    def note(self, backend_id: str, key: str, value: float) -> None:
        """Record a named score for the decision receipt (only when explaining)."""
        entry = self.receipt.get(backend_id)
        if entry is None:
            entry = self.receipt[backend_id] = {}
        entry[key] = value

    def hashes(self) -> list[int]:
        if self._hashes is None:
            index = self.services.prefix_index
            if index is None:
                self._hashes = []
            else:
                hashes = index.hashes(self.ctx.prompt_text, self.ctx.model, self.ctx.session_id)
                cap = self.services.max_blocks
                self._hashes = hashes if cap is None or len(hashes) <= cap else hashes[:cap]
        return self._hashes

    def prefix(self) -> PrefixMatch:
        if self._match is None:
            index = self.services.prefix_index
            hashes = self.hashes()
            self._match = _NO_MATCH if index is None or not hashes else index.match(hashes)
        return self._match

    def text_bytes(self) -> int:
        """The prompt's length in the unit blocks are cut in (UTF-8 bytes)."""
        text = self.ctx.prompt_text
        return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))

    def cached_chars(self, backend_id: str) -> int:
        match = self.prefix()
        return match.blocks(backend_id) * match.chars_per_block

    def cache_ratio(self, backend_id: str) -> float:
        """Share of the prompt this backend is believed to hold in its prefix cache."""
        n = self.text_bytes()
        return 0.0 if n == 0 else min(1.0, self.cached_chars(backend_id) / n)

    def precise(self) -> PreciseMatch:
        """Leading blocks of the prompt's token ids each backend holds by its own events;
        empty without the precise index or the token ids."""
        if self._precise is None:
            index = self.services.precise_index
            ids = self.ctx.prompt_token_ids
            self._precise = NO_MATCH if index is None or ids is None else index.match(ids)
        return self._precise

    def is_precise(self, backend_id: str) -> bool:
        """Whether this backend's precise state stands for it in this request: its index is
        trusted now and the prompt's token ids are known."""
        index = self.services.precise_index
        return (
            index is not None
            and self.ctx.prompt_token_ids is not None
            and index.precise(backend_id, self.now)
        )

    def uncached_by_backend(self) -> dict[str, int]:
        """Uncached prompt tokens per backend holding part of the prompt; every other backend
        has all `ctx.prompt_tokens` uncached. From the precise index for the backends it
        stands for (prompt_tokens is then the token ids' count); otherwise prompt_tokens is
        scaled by the share of the text the approximate index matched, so this holds whichever
        token counter filled prompt_tokens."""
        if self._uncached is None:
            match = self.prefix()
            uncached: dict[str, int] = {}
            n = self.text_bytes() if match.matched else 0
            if n:
                tokens, cpb = self.ctx.prompt_tokens, match.chars_per_block
                # tokens x the uncached share of the text, with the division and the rounding
                # done once per distinct match length (usually one: every holder matched it all)
                by_blocks: dict[int, int] = {}
                for bid, blocks in match.matched.items():
                    left = by_blocks.get(blocks)
                    if left is None:
                        rest = n - blocks * cpb
                        left = by_blocks[blocks] = (
                            max(0, round(tokens * rest / n)) if rest > 0 else 0
                        )
                    uncached[bid] = left
            if self.services.precise_index is not None and self.ctx.prompt_token_ids is not None:
                uncached = self._precise_uncached(uncached)
            self._uncached = uncached
        return self._uncached

    def _precise_uncached(self, approximate: dict[str, int]) -> dict[str, int]:
        out = {b: v for b, v in approximate.items() if not self.is_precise(b)}
        precise = self.precise()
        for b in precise.held:
            if self.is_precise(b):
                out[b] = max(0, precise.num_tokens - precise.cached_tokens(b))
        return out

    def uncached_tokens(self, backend_id: str) -> int:
        """Prompt tokens this backend would still have to prefill."""
        return self.uncached_by_backend().get(backend_id, self.ctx.prompt_tokens)


class Filter(Protocol):
    name: str
    type: str

    def filter(
        self, req: SchedulingRequest, candidates: Sequence[Backend]
    ) -> Sequence[Backend]: ...


class Scorer(Protocol):
    name: str
    type: str

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        """One score in [0, 1] per candidate, in order; higher is better."""
        ...


class Picker(Protocol):
    name: str
    type: str

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        """Choose one of the non-empty `candidates`; `totals` are the profile's weighted sums."""
        ...


class ProfileRunner(Protocol):
    name: str

    def run(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> Backend | None: ...


class ProfileHandler(Protocol):
    name: str
    type: str

    def profile_names(self) -> list[str]:
        """The profiles `handle` runs by name; the configuration must define them."""
        ...

    def handle(
        self,
        req: SchedulingRequest,
        candidates: Sequence[Backend],
        profiles: Mapping[str, ProfileRunner],
    ) -> Decision:
        """Run the profiles this request needs and merge their picks; raise NoCandidate."""
        ...


# Optional plugin hooks.


@runtime_checkable
class PickObserver(Protocol):
    def on_picked(self, req: SchedulingRequest, decision: Decision) -> None:
        """The scheduler settled on `decision` (record affinities here)."""
        ...


@runtime_checkable
class BackendObserver(Protocol):
    def on_backend_removed(self, backend_id: str) -> None:
        """A backend left the fleet."""
        ...


@runtime_checkable
class ProgramKeeper(Protocol):
    def end_program(self, program_id: str) -> bool:
        """Forget an agent program; False when it is not known."""
        ...


@runtime_checkable
class MetricsUser(Protocol):
    def bind_metrics(self, registry: CollectorRegistry) -> None:
        """Register the plugin's metrics on the proxy's registry."""
        ...


@runtime_checkable
class StatsReporter(Protocol):
    name: str

    def stats(self) -> Mapping[str, object]:
        """State shown under the plugin's name by `GET /admin/policy`."""
        ...
