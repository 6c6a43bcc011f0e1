"""The artifact bundle of a bench run: files, provenance and the markdown report."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from bench.records import RequestRecord
from bench.summary import dig


def git_info(cwd: Path | None = None) -> dict[str, Any]:
    """Commit and dirtiness of the checkout the bench runs from (None outside git)."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def write_json(path: Path, obj: Any) -> None:
    path.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


class RecordSink:
    """Appends each record to metrics.jsonl as it completes (flushed, so an interrupted run
    keeps every finished request) and keeps them in memory for the summary."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[RequestRecord] = []
        self._file: IO[bytes] = path.open("wb")

    def __call__(self, record: RequestRecord) -> None:
        self.records.append(record)
        self._file.write(orjson.dumps(record.to_json()) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_records(path: Path) -> list[RequestRecord]:
    with path.open("rb") as f:
        return [RequestRecord.from_json(orjson.loads(line)) for line in f if line.strip()]


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


SETTINGS_COLUMNS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("requests", ("requests",), 0),
    ("errors", ("errors",), 0),
    ("TTFT p50", ("ttft_ms", "p50"), 1),
    ("TTFT p90", ("ttft_ms", "p90"), 1),
    ("TTFT p99", ("ttft_ms", "p99"), 1),
    ("TPOT p50", ("tpot_ms", "p50"), 2),
    ("TPOT p90", ("tpot_ms", "p90"), 2),
    ("E2E p50", ("e2e_ms", "p50"), 1),
    ("E2E p90", ("e2e_ms", "p90"), 1),
    ("E2E p99", ("e2e_ms", "p99"), 1),
    ("req/s", ("throughput", "requests_per_s"), 2),
    ("out tok/s", ("throughput", "output_tokens_per_s"), 1),
    ("goodput req/s", ("slo", "goodput_rps"), 2),
    ("SLO %", ("slo", "attainment_pct"), 1),
    ("prefix hit %", ("prefix_hit_pct",), 1),
    ("req max/min", ("balance", "requests_max_over_min"), 2),
)


def settings_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """One markdown row per setting; latencies in ms."""
    head = "| setting | " + " | ".join(c[0] for c in SETTINGS_COLUMNS) + " |"
    sep = "|---" * (len(SETTINGS_COLUMNS) + 1) + "|"
    rows = [head, sep]
    for name, s in summaries.items():
        view = dict(s)
        att = dig(s, "slo", "attainment")
        view["slo"] = {
            **(s.get("slo") or {}),
            "attainment_pct": att * 100 if att is not None else None,
        }
        rate = dig(s, "backend_metrics", "prefix_hit_rate")
        view["prefix_hit_pct"] = rate * 100 if rate is not None else None
        # Behind a router that sets no x-fleet-backend header, balance comes from /metrics.
        if dig(s, "balance", "requests_max_over_min") is None:
            snap = dig(s, "backend_metrics", "requests_max_over_min")
            view["balance"] = {"requests_max_over_min": snap}
        cells = [_fmt(dig(view, *path), digits) for _, path, digits in SETTINGS_COLUMNS]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def comparison_table(baseline: str, other: str, rows: Sequence[Mapping[str, Any]]) -> str:
    out = [
        f"Paired runs, B = {other} vs A = {baseline}: mean of (B - A) with its 95% CI.",
        "",
        "| metric | A mean | B mean | B - A | 95% CI | relative | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci = f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if r["ci_low"] is not None else "-"
        rel = f"{r['relative'] * 100:+.1f}%" if r["relative"] is not None else "-"
        out.append(
            f"| {r['metric']} | {r['mean_a']:.2f} | {r['mean_b']:.2f} | {r['mean_diff']:+.2f} "
            f"| {ci} | {rel} | {r['verdict']} |"
        )
    return "\n".join(out)
