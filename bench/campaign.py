"""A bench campaign: settings x repeats, run in alternation, written as one artifact bundle.

Order is A0 B0 A1 B1 ... so that drift of the machine over time hits both settings alike.
Each run gets its own workload from `make_workload(run_index)`: with the default isolation the
text is salted per run (same lengths, sharing and timing; different characters), so a run
never starts on prefixes cached by the run before it. With a `before_run` hook that restarts
or resets the fleet, isolation can be off and every run sends byte-identical prompts.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.artifacts import RecordSink, comparison_table, settings_table, write_json
from bench.backend_metrics import backend_id, fetch_metrics, summarize_snapshots
from bench.paired import compare_settings
from bench.records import RequestRecord
from bench.runner import Replay, RunOptions
from bench.summary import dig, summarize
from bench.workload import Workload

# How to install what plots, paired comparisons and ShareGPT need, from a checkout.
BENCH_EXTRA = "pip install -e '.[bench]'"


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    base_url: str
    router_settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class CampaignPlan:
    settings: Sequence[Setting]
    make_workload: Callable[[int], Workload]
    options: RunOptions  # base_url is replaced per setting
    out_dir: Path
    repeat: int = 1
    slo: Mapping[str, float] = field(default_factory=dict)
    backend_metrics: Sequence[str] = ()
    before_run: str | None = None  # shell command run before each run
    progress: bool = True
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RunResult:
    setting: str
    repeat: int
    records: list[RequestRecord]
    summary: dict[str, Any]
    complete: bool = True  # False for a run cut short by Ctrl-C: kept, but never paired


async def detect_model(base_url: str) -> str | None:
    """The first model the target lists on /v1/models, if it answers."""
    base = base_url.rstrip("/")
    url = base + ("/models" if base.endswith("/v1") else "/v1/models")
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
            http.get(url) as resp,
        ):
            data = await resp.json(content_type=None)
        return str(data["data"][0]["id"])
    except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, TypeError, ValueError):
        return None


def _run_hook(command: str, setting: Setting, repeat: int) -> None:
    env = {
        **os.environ,
        "BENCH_SETTING": setting.name,
        "BENCH_REPEAT": str(repeat),
        "BENCH_TARGET": setting.base_url,
    }
    subprocess.run(command, shell=True, check=True, env=env)


def _mean_over(runs: Sequence[RunResult], *keys: str) -> float | None:
    vals = [v for run in runs if (v := dig(run.summary, *keys)) is not None]
    return statistics.fmean(vals) if vals else None


def pooled_summary(
    runs: Sequence[RunResult], slo: Mapping[str, float], backends: Sequence[str]
) -> dict[str, Any]:
    """Distributions over all requests of a setting; rates as the mean over its runs (runs
    are sequential, so pooling their records would divide by one run's duration)."""
    records = [r for run in runs for r in run.records]
    s = summarize(records, slo, backends)
    if not runs:
        return s
    for key in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s"):
        s["throughput"][key] = _mean_over(runs, "throughput", key)
    s["slo"]["goodput_rps"] = _mean_over(runs, "slo", "goodput_rps")
    s["duration_s"] = sum(run.summary["duration_s"] for run in runs)
    s["runs"] = len(runs)
    if any(run.summary.get("backend_metrics") for run in runs):
        q = sum(dig(run.summary, "backend_metrics", "prefix_queries") or 0.0 for run in runs)
        h = sum(dig(run.summary, "backend_metrics", "prefix_hits") or 0.0 for run in runs)
        s["backend_metrics"] = {
            "prefix_queries": q,
            "prefix_hits": h,
            "prefix_hit_rate": h / q if q else None,
            "requests_max_over_min": _mean_over(runs, "backend_metrics", "requests_max_over_min"),
            "tokens_max_over_min": _mean_over(runs, "backend_metrics", "tokens_max_over_min"),
        }
    return s


class Campaign:
    def __init__(self, plan: CampaignPlan) -> None:
        self.plan = plan
        self.results: list[RunResult] = []
        self.interrupted = False

    async def run(self) -> dict[str, Any]:
        plan = self.plan
        plan.out_dir.mkdir(parents=True, exist_ok=True)
        write_json(plan.out_dir / "config.json", plan.config)
        sink = RecordSink(plan.out_dir / "metrics.jsonl")
        order = [(k, s) for k in range(plan.repeat) for s in plan.settings]
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=not plan.progress,
            transient=False,
        )
        try:
            with progress:
                for index, (k, setting) in enumerate(order):
                    workload = plan.make_workload(index)
                    task = progress.add_task(f"{setting.name} #{k}", total=workload.n_requests)

                    def on_record(r: RequestRecord, task_id: Any = task) -> None:
                        sink(r)
                        progress.advance(task_id)

                    await self._one_run(setting, k, workload, on_record, sink)
        except asyncio.CancelledError:
            self.interrupted = True
        finally:
            sink.close()
        return self.finish()

    async def _one_run(
        self,
        setting: Setting,
        k: int,
        workload: Workload,
        on_record: Callable[[RequestRecord], None],
        sink: RecordSink,
    ) -> None:
        plan = self.plan
        if plan.before_run:
            await asyncio.to_thread(_run_hook, plan.before_run, setting, k)
        before = await fetch_metrics(plan.backend_metrics) if plan.backend_metrics else {}
        first = len(sink.records)
        cpu0 = time.process_time()
        replay = Replay(
            replace(plan.options, base_url=setting.base_url), setting.name, k, on_record
        )
        complete = False
        try:
            await replay.run(workload)
            complete = True
        finally:
            cpu = time.process_time() - cpu0
            # Even when interrupted: summarize what this run collected.
            after = await fetch_metrics(plan.backend_metrics) if plan.backend_metrics else {}
            records = sink.records[first:]
            summary = summarize(records, plan.slo, self._backends())
            summary["client"] = {
                "cpu_s": cpu,
                "cpu_utilization": cpu / summary["duration_s"] if summary["duration_s"] else None,
            }
            if plan.backend_metrics:
                summary["backend_metrics"] = summarize_snapshots(before, after)
                self._save_snapshots(setting.name, k, before, after)
            summary["complete"] = complete
            self.results.append(RunResult(setting.name, k, records, summary, complete))

    def _backends(self) -> list[str]:
        return [backend_id(u) for u in self.plan.backend_metrics]

    def _save_snapshots(
        self, name: str, k: int, before: Mapping[str, str | None], after: Mapping[str, str | None]
    ) -> None:
        d = self.plan.out_dir / "backend_metrics" / f"{name}-{k}"
        d.mkdir(parents=True, exist_ok=True)
        for tag, snap in (("before", before), ("after", after)):
            for bid, text in snap.items():
                if text is not None:
                    (d / f"{bid.replace(':', '_')}.{tag}.prom").write_text(text)

    def finish(self) -> dict[str, Any]:
        """Write summary.json, plots and report.md from whatever was collected."""
        plan = self.plan
        by_setting: dict[str, list[RunResult]] = {}
        for r in self.results:
            by_setting.setdefault(r.setting, []).append(r)
        pooled = {
            n: pooled_summary(runs, plan.slo, self._backends()) for n, runs in by_setting.items()
        }
        comparisons: dict[str, Any] = {}
        names = [s.name for s in plan.settings]
        complete = {n: [r for r in runs if r.complete] for n, runs in by_setting.items()}
        if len(names) > 1 and complete.get(names[0]):
            base_runs = complete[names[0]]
            for other in names[1:]:
                runs_b = complete.get(other, [])
                n = min(len(base_runs), len(runs_b))  # complete pairs only
                if n:
                    comparisons[other] = compare_settings(
                        [r.summary for r in base_runs[:n]], [r.summary for r in runs_b[:n]]
                    )
        summary = {
            "interrupted": self.interrupted,
            "settings": pooled,
            "runs": [{"setting": r.setting, "repeat": r.repeat, **r.summary} for r in self.results],
            "comparison": {"baseline": names[0], "vs": comparisons} if comparisons else None,
        }
        write_json(plan.out_dir / "summary.json", summary)
        plots = {}
        try:
            from bench.plots import cdf_plot
        except ImportError:
            # matplotlib and numpy come with the bench extra; the numbers do not need them.
            can_plot = False
        else:
            can_plot = True
        for key, label in (("ttft_s", "TTFT"), ("e2e_s", "E2E")):
            if not can_plot:
                break
            series = {
                n: [
                    getattr(x, key) * 1000
                    for run in runs
                    for x in run.records
                    if x.ok and getattr(x, key) is not None
                ]
                for n, runs in by_setting.items()
            }
            path = cdf_plot(
                series, f"{label} CDF", f"{label} (ms)", plan.out_dir / f"{label.lower()}_cdf.png"
            )
            if path is not None:
                plots[label] = path.name
        report = ["# Bench report", "", settings_table(pooled), ""]
        for other, rows in comparisons.items():
            report += [comparison_table(names[0], other, rows), ""]
        if self.interrupted:
            report.insert(1, "\n**Interrupted**: partial results.")
        report += [f"![{k}]({v})" for k, v in plots.items()]
        if not can_plot:
            report.append(f"No CDF plots: they need matplotlib and numpy ({BENCH_EXTRA}).")
        (plan.out_dir / "report.md").write_text("\n".join(report) + "\n")
        return summary
