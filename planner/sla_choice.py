"""What `fleet-proxy profile-sla` concludes from its measurements: pure functions, no I/O.

The measuring plan (which input lengths, contexts and in-flight counts to try), the ITL of a
decode run, the best point per configuration, the configuration chosen per role, and the
load-based planner thresholds it suggests.

Per configuration, at the target (ISL, OSL) with SLA targets TTFT_SLA and ITL_SLA:

    prefill: TTFT = TTFT_profile(ISL); throughput per GPU = ISL / TTFT / num_gpu
    decode:  at L = ISL + OSL / 2, n* = the in-flight count with ITL(n, L) <= ITL_SLA and the
             most tokens/s n / ITL(n, L) (planner.sla.decode_replicas), searched no further
             than the largest in-flight count measured; throughput per GPU = n* / ITL / num_gpu

Each role's configuration is chosen apart: among those meeting its SLA, the most throughput
per GPU; when none meets it, the closest (lowest TTFT; lowest ITL at one request in flight).

Suggested thresholds for the load-based planner, from the chosen configurations:

    prefill queue upper = clip((TTFT_SLA - TTFT) / TTFT, 0.1, 5)   queued requests per worker
                          a prompt can wait behind and still meet the SLA
    prefill queue lower = 0.4 * upper                             (the defaults' 0.2 / 0.5)
    decode KV upper     = clip(n* * L / kv_tokens, 0.05, 0.9)      KV utilisation at n*
    decode KV lower     = 0.5 * upper
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner.profile_file import ConfigProfile, SlaTarget
from planner.sla import DecodeGrid, DecodeProfile, PrefillCurve, decode_replicas

ISL_FACTORS = (0.125, 0.25, 0.5, 1.0, 1.5, 2.0)
CONTEXT_FACTORS = (0.5, 1.0, 1.5)

PREFILL_QUEUE_CLIP = (0.1, 5.0)
PREFILL_QUEUE_LOWER_FRACTION = 0.4
DECODE_KV_CLIP = (0.05, 0.9)
DECODE_KV_LOWER_FRACTION = 0.5

# (time in seconds, completion tokens so far) for each streamed chunk of one request.
Stream = Sequence[tuple[float, int]]


# ---- the measuring plan ---------------------------------------------------------------------


def isl_sweep(isl: int, factors: Iterable[float], max_model_len: int) -> tuple[int, ...]:
    """Input lengths to time, each at least 1 and leaving room for one output token."""
    top = max_model_len - 1
    return tuple(sorted({min(top, max(1, round(isl * f))) for f in factors}))


def decode_prompt_lengths(
    context: float, factors: Iterable[float], decode_tokens: int, max_model_len: int
) -> tuple[int, ...]:
    """Prompt lengths P whose decode runs average context P + decode_tokens / 2 near
    factor * `context`, each fitting with its decode_tokens in max_model_len."""
    top = max_model_len - decode_tokens
    if top < 1:
        return ()
    half = decode_tokens / 2
    return tuple(sorted({min(top, max(1, round(context * f - half))) for f in factors}))


def fits_in_flight(kv_blocks: int, block_size: int, tokens_per_request: int) -> int:
    """Requests of `tokens_per_request` tokens whose KV blocks all fit at once."""
    blocks_each = -(-tokens_per_request // block_size)
    return kv_blocks // max(blocks_each, 1)


def in_flight_grid(most: int) -> tuple[int, ...]:
    """1, 2, 4, ... under `most`, then `most` itself."""
    grid: list[int] = []
    n = 1
    while n < most:
        grid.append(n)
        n *= 2
    if most >= 1:
        grid.append(most)
    return tuple(grid)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def itl_after_all_started(streams: Sequence[Stream]) -> float | None:
    """Mean seconds per token while all the streams decode together.

    The window opens at the latest first chunk (every request is past its first token, so no
    prefill shares a step) and closes at the earliest last chunk (none has finished yet, so
    the batch holds all of them). Each stream contributes the time and tokens between its
    first and last chunk inside the window; ITL = their summed times / their summed tokens.
    None when the window holds no token (a request was queued until another finished)."""
    if not streams or any(not s for s in streams):
        return None
    start = max(s[0][0] for s in streams)
    end = min(s[-1][0] for s in streams)
    seconds = 0.0
    tokens = 0
    for s in streams:
        inside = [(t, k) for t, k in s if start <= t <= end]
        if len(inside) >= 2:
            seconds += inside[-1][0] - inside[0][0]
            tokens += inside[-1][1] - inside[0][1]
    return seconds / tokens if tokens > 0 else None


# ---- the choice -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    config: str
    num_gpu: int
    ttft: float  # seconds, at the target ISL
    throughput_per_gpu: float  # tokens/s/GPU
    meets: bool


@dataclass(frozen=True, slots=True)
class DecodePoint:
    config: str
    num_gpu: int
    in_flight: int  # n*
    itl: float  # seconds, at n* and the target context
    throughput_per_gpu: float  # tokens/s/GPU
    kv_utilisation: float | None  # n* * context / kv_tokens; None: capacity unknown
    meets: bool


@dataclass(frozen=True, slots=True)
class Thresholds:
    prefill_queue_upper: float
    prefill_queue_lower: float
    decode_kv_upper: float | None
    decode_kv_lower: float | None


@dataclass(frozen=True, slots=True)
class Recommendation:
    prefill: PrefillPoint
    decode: DecodePoint
    thresholds: Thresholds
    prefill_points: tuple[PrefillPoint, ...]  # every configuration, in the order given
    decode_points: tuple[DecodePoint, ...]


@dataclass(frozen=True, slots=True)
class _Measured:
    """A decode grid searched no further than its largest measured in-flight count, so the
    choice never rests on an extrapolated ITL."""

    grid: DecodeGrid

    def itl(self, in_flight: int, context: float) -> float:
        return self.grid.itl(in_flight, context)

    def max_in_flight(self, context: float) -> int:
        measured = int(max(n for _, curve in self.grid.curves for n, _ in curve))
        return min(self.grid.max_in_flight(context), measured)


def target_context(sla: SlaTarget) -> float:
    return sla.isl + sla.osl / 2


def prefill_point(sla: SlaTarget, config: ConfigProfile) -> PrefillPoint:
    ttft = PrefillCurve(config.prefill.points).ttft(sla.isl)
    return PrefillPoint(
        config=config.name,
        num_gpu=config.num_gpu,
        ttft=ttft,
        throughput_per_gpu=sla.isl / ttft / config.num_gpu,
        meets=ttft <= sla.ttft,
    )


def decode_point(sla: SlaTarget, config: ConfigProfile) -> DecodePoint:
    grid = DecodeGrid(config.decode.curves, config.decode.kv_tokens)
    profile: DecodeProfile = _Measured(grid)
    plan = decode_replicas(0.0, sla.isl, sla.osl, profile, sla.itl)
    kv = config.decode.kv_tokens
    return DecodePoint(
        config=config.name,
        num_gpu=config.num_gpu,
        in_flight=plan.in_flight,
        itl=plan.itl,
        throughput_per_gpu=plan.engine_throughput / config.num_gpu,
        kv_utilisation=plan.in_flight * target_context(sla) / kv if kv else None,
        meets=plan.meets_target,
    )


def _clip(x: float, bounds: tuple[float, float]) -> float:
    return min(max(x, bounds[0]), bounds[1])


def thresholds(sla: SlaTarget, prefill: PrefillPoint, decode: DecodePoint) -> Thresholds:
    upper = _clip((sla.ttft - prefill.ttft) / prefill.ttft, PREFILL_QUEUE_CLIP)
    kv_upper = (
        None if decode.kv_utilisation is None else _clip(decode.kv_utilisation, DECODE_KV_CLIP)
    )
    return Thresholds(
        prefill_queue_upper=upper,
        prefill_queue_lower=upper * PREFILL_QUEUE_LOWER_FRACTION,
        decode_kv_upper=kv_upper,
        decode_kv_lower=None if kv_upper is None else kv_upper * DECODE_KV_LOWER_FRACTION,
    )


def recommend(sla: SlaTarget, configs: Sequence[ConfigProfile]) -> Recommendation:
    """Each role's configuration and the planner thresholds (see the module's formulas)."""
    if not configs:
        raise ValueError("no configuration was profiled")
    prefills = tuple(prefill_point(sla, c) for c in configs)
    decodes = tuple(decode_point(sla, c) for c in configs)
    met_p = [p for p in prefills if p.meets]
    prefill = (
        max(met_p, key=lambda p: p.throughput_per_gpu)
        if met_p
        else min(prefills, key=lambda p: p.ttft)
    )
    met_d = [d for d in decodes if d.meets]
    decode = (
        max(met_d, key=lambda d: d.throughput_per_gpu)
        if met_d
        else min(decodes, key=lambda d: d.itl)  # n* is 1 when missed: the lowest ITL there is
    )
    return Recommendation(prefill, decode, thresholds(sla, prefill, decode), prefills, decodes)


def report_lines(sla: SlaTarget, rec: Recommendation) -> list[str]:
    """What the command prints: one line per configuration, then the suggestions."""
    lines: list[str] = []
    for p, d in zip(rec.prefill_points, rec.decode_points, strict=True):
        lines.append(
            f"{p.config} ({p.num_gpu} GPU): TTFT {p.ttft * 1e3:.1f} ms at ISL {sla.isl:g}, "
            f"{p.throughput_per_gpu:.0f} tokens/s/GPU prefill; ITL {d.itl * 1e3:.2f} ms at "
            f"{d.in_flight} in flight, {d.throughput_per_gpu:.0f} tokens/s/GPU decode"
        )
    p, d, t = rec.prefill, rec.decode, rec.thresholds
    lines.append(
        f"Suggested prefill config: {p.config} (TTFT {p.ttft * 1e3:.1f} ms, "
        f"throughput {p.throughput_per_gpu:.0f} tokens/s/GPU)"
    )
    lines.append(
        "Suggested planner upper/lower bound for prefill queue size: "
        f"{t.prefill_queue_upper:.2f}/{t.prefill_queue_lower:.2f}"
    )
    lines.append(
        f"Suggested decode config: {d.config} (ITL {d.itl * 1e3:.2f} ms at {d.in_flight} in "
        f"flight, throughput {d.throughput_per_gpu:.0f} tokens/s/GPU)"
    )
    kv = (
        "unknown (no KV capacity measured)"
        if t.decode_kv_upper is None or t.decode_kv_lower is None
        else f"{t.decode_kv_upper:.2f}/{t.decode_kv_lower:.2f}"
    )
    lines.append(f"Suggested planner upper/lower bound for decode kv cache utilization: {kv}")
    if not p.meets:
        lines.append(
            f"WARNING: no configuration meets the TTFT SLA of {sla.ttft * 1e3:g} ms at ISL "
            f"{sla.isl:g}; the closest ({p.config}) was chosen"
        )
    if not d.meets:
        lines.append(
            f"WARNING: no configuration meets the ITL SLA of {sla.itl * 1e3:g} ms even with one "
            f"request in flight; the closest ({d.config}) was chosen"
        )
    return lines
