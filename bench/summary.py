"""A run's summary: latency distributions, throughput, goodput/SLO attainment, balance."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from bench.metrics import distribution
from bench.records import RequestRecord

SLO_KEYS = ("ttft", "tpot", "e2e")


def dig(d: Any, *keys: str) -> Any:
    """d[k1][k2]... or None where a level is missing (summaries are nested JSON)."""
    for k in keys:
        if not isinstance(d, Mapping):
            return None
        d = d.get(k)
    return d


def parse_slo(specs: Sequence[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` (milliseconds) -> {"ttft": 0.5, "tpot": 0.05} (seconds)."""
    out: dict[str, float] = {}
    for spec in specs:
        key, sep, value = spec.partition(":")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"bad SLO {spec!r}: expected one of {SLO_KEYS} as KEY:MS")
        ms = float(value)
        if ms <= 0:
            raise ValueError(f"bad SLO {spec!r}: the bound must be positive")
        out[key] = ms / 1000.0
    return out


def meets_slo(r: RequestRecord, slo: Mapping[str, float]) -> bool:
    """A failed request meets no SLO. A one-token reply has no TPOT and so cannot miss it."""
    if not r.ok:
        return False
    values = {"ttft": r.ttft_s, "tpot": r.tpot_s, "e2e": r.e2e_s}
    for key, bound in slo.items():
        v = values[key]
        if v is None:
            if key == "tpot":
                continue
            return False
        if v > bound:
            return False
    return True


def _ms(values: Sequence[float]) -> dict[str, float | None]:
    d = distribution([v * 1000.0 for v in values])
    if d["n"] is not None:
        d["n"] = int(d["n"])
    return d


def _ratio(values: Sequence[float]) -> float | None:
    lo = min(values, default=0.0)
    return max(values) / lo if lo > 0 else None


def balance(records: Sequence[RequestRecord], backends: Sequence[str] = ()) -> dict[str, Any]:
    """Requests and tokens per backend; max/min ratios and the coefficient of variation.

    `backends` lists backends known to exist, so one that received nothing shows as 0 (and
    the ratio as undefined) rather than vanishing from the table.
    """
    if not any(r.backend for r in records if r.ok):
        # The target names no backend (a peer router, a bare engine): nothing to attribute;
        # the /metrics snapshots give balance instead.
        return {
            "backends": {},
            "requests_max_over_min": None,
            "tokens_max_over_min": None,
            "requests_cv": None,
            "source": "no x-fleet-backend header",
        }
    per: dict[str, dict[str, int]] = {
        b: {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0} for b in backends
    }
    for r in records:
        if not r.ok:
            continue
        b = per.setdefault(
            r.backend or "unknown", {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
        )
        b["requests"] += 1
        b["prompt_tokens"] += r.prompt_tokens or r.est_prompt_tokens
        b["completion_tokens"] += r.completion_tokens or 0
    total = sum(b["requests"] for b in per.values())
    counts = [float(b["requests"]) for b in per.values()]
    tokens = [float(b["prompt_tokens"] + b["completion_tokens"]) for b in per.values()]
    mean = statistics.fmean(counts) if counts else 0.0
    return {
        "backends": {
            k: {**v, "share": v["requests"] / total if total else 0.0}
            for k, v in sorted(per.items())
        },
        "requests_max_over_min": _ratio(counts) if counts else None,
        "tokens_max_over_min": _ratio(tokens) if tokens else None,
        "requests_cv": statistics.pstdev(counts) / mean if len(counts) > 1 and mean else 0.0,
    }


def summarize(
    records: Sequence[RequestRecord],
    slo: Mapping[str, float] | None = None,
    backends: Sequence[str] = (),
) -> dict[str, Any]:
    slo = slo or {}
    ok = [r for r in records if r.ok]
    if records:
        start = min(r.sent_s for r in records)
        end = max(r.sent_s + (r.e2e_s or 0.0) for r in records)
        duration = max(end - start, 1e-9)
    else:
        duration = 0.0
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or r.est_prompt_tokens for r in ok)
    met = sum(1 for r in records if meets_slo(r, slo))

    def per_s(x: float) -> float | None:
        return x / duration if duration else None

    return {
        "requests": len(records),
        "completed": len(ok),
        "errors": len(records) - len(ok),
        "error_kinds": dict(Counter(r.error for r in records if r.error).most_common()),
        "usage_missing": sum(1 for r in ok if not r.usage_reported),
        "duration_s": duration,
        "throughput": {
            "requests_per_s": per_s(len(ok)),
            "output_tokens_per_s": per_s(out_tokens),
            "total_tokens_per_s": per_s(out_tokens + in_tokens),
        },
        "tokens": {"input": in_tokens, "output": out_tokens},
        "ttft_ms": _ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": _ms([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_ms": _ms([x for r in ok for x in r.itl_s]),
        "e2e_ms": _ms([r.e2e_s for r in ok if r.e2e_s is not None]),
        "send_delay_ms": _ms([r.sent_s - r.scheduled_s for r in records]),
        "slo": {
            "targets_ms": {k: v * 1000.0 for k, v in slo.items()},
            "met": met,
            "attainment": met / len(records) if records else None,
            "goodput_rps": per_s(met),
        },
        "balance": balance(records, backends),
    }
