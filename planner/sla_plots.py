"""The two plots of `fleet-proxy profile-sla`, via matplotlib's object API on the Agg canvas
(no pyplot state, no display). matplotlib is the `plots` extra: `pip install
'fleet-proxy[plots]'`; the command checks for it before measuring anything."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from planner.profile_file import ConfigProfile, SlaTarget
from planner.sla import DecodeGrid
from planner.sla_choice import Recommendation, target_context

PREFILL_PNG = "prefill_ttft.png"
DECODE_PNG = "decode_itl.png"


def _figure() -> Figure:
    fig = Figure(figsize=(7, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _finish(fig: Figure, ax: Axes, title: str, xlabel: str, ylabel: str, path: Path) -> Path:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_prefill(
    sla: SlaTarget, configs: Sequence[ConfigProfile], rec: Recommendation, path: Path
) -> Path:
    """TTFT over ISL per configuration, the TTFT SLA and the target ISL."""
    fig = _figure()
    ax = fig.add_subplot()
    for c in configs:
        xs = [x for x, _ in c.prefill.points]
        ys = [y * 1e3 for _, y in c.prefill.points]
        chosen = " (chosen)" if c.name == rec.prefill.config else ""
        ax.plot(xs, ys, marker="o", label=f"{c.name}, {c.num_gpu} GPU{chosen}")
    ax.axhline(sla.ttft * 1e3, color="red", linestyle="--", label=f"TTFT SLA {sla.ttft * 1e3:g} ms")
    ax.axvline(sla.isl, color="grey", linestyle=":", label=f"target ISL {sla.isl:g}")
    return _finish(
        fig, ax, "Prefill: TTFT of one request alone", "input length (tokens)", "TTFT (ms)", path
    )


def plot_decode(
    sla: SlaTarget, configs: Sequence[ConfigProfile], rec: Recommendation, path: Path
) -> Path:
    """ITL over in-flight requests per configuration at the target context, the ITL SLA, each
    configuration's best point and the chosen one."""
    fig = _figure()
    ax = fig.add_subplot()
    context = target_context(sla)
    for c, best in zip(configs, rec.decode_points, strict=True):
        grid = DecodeGrid(c.decode.curves, c.decode.kv_tokens)
        # Counts measured at other contexts that the KV cache cannot hold at this one are left
        # out: their ITL here would be an extrapolation.
        fits = grid.max_in_flight(context)
        ns = sorted({n for _, curve in c.decode.curves for n, _ in curve if n <= fits})
        (line,) = ax.plot(
            ns, [grid.itl(int(n), context) * 1e3 for n in ns], marker="o", label=c.name
        )
        chosen = best.config == rec.decode.config
        ax.plot(
            [best.in_flight],
            [best.itl * 1e3],
            marker="*" if chosen else "D",
            markersize=16 if chosen else 8,
            color=line.get_color(),
            linestyle="none",
            label=f"{c.name} best: {best.in_flight} in flight" + (" (chosen)" if chosen else ""),
        )
    ax.axhline(sla.itl * 1e3, color="red", linestyle="--", label=f"ITL SLA {sla.itl * 1e3:g} ms")
    title = f"Decode: ITL at context {context:g} tokens"
    return _finish(fig, ax, title, "requests in flight", "ITL (ms)", path)


def write_plots(
    sla: SlaTarget, configs: Sequence[ConfigProfile], rec: Recommendation, folder: Path
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [
        plot_prefill(sla, configs, rec, folder / PREFILL_PNG),
        plot_decode(sla, configs, rec, folder / DECODE_PNG),
    ]
