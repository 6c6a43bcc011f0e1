"""LoRA affinity: prefer the engine where the request's adapter is already running.

From each engine's latest `vllm:lora_requests_info` (fleet/vllm_metrics.py), for a request
whose model names a LoRA adapter on that engine (not its base model, the scraped
`model_name`):
- 1.0: the adapter is running there (one of its requests is in the batch);
- 0.8: it is waiting there (queued for a LoRA slot: it will be loaded soon anyway);
- 0.5: the engine has a free LoRA slot (fewer running adapters than `max_lora`);
- 0.0: every slot holds another adapter (its requests would wait for one to drain).
A request for the engine's base model scores 1.0 (nothing to load); an engine that publishes
no LoRA state yet scores 0.5 (as good as a free slot: nothing is known against it).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.types import Backend, EngineMetrics
from policies.framework import PluginBase, SchedulingRequest

RUNNING = 1.0
WAITING = 0.8
FREE_SLOT = 0.5
FULL = 0.0


def lora_affinity(model: str, m: EngineMetrics | None) -> float:
    if m is None:
        return FREE_SLOT
    if model in m.models:
        return RUNNING  # the base model: no adapter to load
    if m.max_lora is None:
        return FREE_SLOT
    if model in m.lora_running:
        return RUNNING
    if model in m.lora_waiting:
        return WAITING
    return FREE_SLOT if len(m.lora_running) < m.max_lora else FULL


class LoraAffinityScorer(PluginBase):
    type = "lora-affinity-scorer"

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        model = req.ctx.model
        return [
            lora_affinity(model, None if b.snapshot is None else b.snapshot.metrics)
            for b in candidates
        ]
