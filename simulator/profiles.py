"""Performance profiles: cache geometry, scheduler limits and a step-time model per hardware.

A step's duration follows a simple roofline: a fixed overhead, plus the larger of reading the
weights once and computing every token scheduled in the step, plus reading the KV of every
token already in context, plus the attention over every (query, key) pair the step computes.
The shipped profiles live in `simulator/profiles/*.yaml`, each citing where its figures come
from.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

DEFAULT_PROFILE = "h100-llama-8b"
_PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True, slots=True)
class StepTime:
    base_s: float
    weight_read_s: float
    per_token_compute_s: float
    per_context_token_s: float
    per_attention_pair_s: float = 0.0

    def duration(self, new_tokens: int, context_tokens: int, attention_pairs: float = 0.0) -> float:
        """Seconds for one engine step computing `new_tokens` (prefill chunks + one per decode)
        over `context_tokens` already-cached tokens of the scheduled requests, with
        `attention_pairs` (query, key) pairs of attention: sum of n * (cached + n / 2)."""
        compute = max(self.weight_read_s, new_tokens * self.per_token_compute_s)
        return (
            self.base_s
            + compute
            + context_tokens * self.per_context_token_s
            + attention_pairs * self.per_attention_pair_s
        )


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    block_size: int
    kv_bytes_per_token: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    step_time: StepTime
    kv_transfer_bandwidth_bytes_per_s: float
    eos_probability: float
    enable_prefix_caching: bool = True
    # Engine seconds from a request's arrival until the scheduler can take it: the API
    # server's parsing, tokenization and hand-off to the engine core.
    request_overhead_s: float = 0.0
    # `generate` serves completions and chat; `pooling` runs the model as a pooling model,
    # serving its task's routes instead (vLLM's `--runner pooling --convert TASK`).
    runner: str = "generate"
    pooling_task: str = "embed"  # or `classify`
    pooled_size: int = 256  # an embedding's dimensions, or a classifier's labels

    def with_overrides(self, **overrides: Any) -> Profile:
        return replace(self, **overrides)


def profile_from_dict(data: dict[str, Any]) -> Profile:
    known = {f.name for f in fields(Profile)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown profile keys: {sorted(unknown)}")
    values = dict(data)
    values["step_time"] = StepTime(**{k: float(v) for k, v in data["step_time"].items()})
    values["kv_transfer_bandwidth_bytes_per_s"] = float(data["kv_transfer_bandwidth_bytes_per_s"])
    values["eos_probability"] = float(data["eos_probability"])
    values["request_overhead_s"] = float(data.get("request_overhead_s", 0.0))
    return Profile(**values)


def available_profiles() -> list[str]:
    return sorted(p.stem for p in _PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name, or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text = path.read_text()
    else:
        res = _PROFILE_DIR / f"{name_or_path}.yaml"
        if not res.is_file():
            raise ValueError(
                f"unknown profile {name_or_path!r}; known: {', '.join(available_profiles())}"
            )
        text = res.read_text()
    return profile_from_dict(yaml.safe_load(text))
