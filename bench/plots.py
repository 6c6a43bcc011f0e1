"""CDF plots, one line per compared setting, via matplotlib's object API on the Agg canvas
(no pyplot global state, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    xlabel: str
    series: Mapping[str, Sequence[float]]  # setting -> values


def _draw(ax: Axes, panel: Panel) -> None:
    for i, (label, values) in enumerate(panel.series.items()):
        if not values:
            continue
        x = np.sort(np.asarray(values, dtype=float))
        y = np.arange(1, x.size + 1) / x.size
        # The default cycle has 10 colours: past that, change the line style too.
        style = ("-", "--", ":", "-.")[(i // 10) % 4]
        ax.step(x, y, where="post", linestyle=style, label=f"{label} (n={x.size})")
    ax.set_title(panel.title)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")


def cdf_figure(panels: Sequence[Panel], path: Path) -> Path | None:
    """Empirical CDFs side by side, one panel each; None when there is nothing to plot."""
    panels = [p for p in panels if any(p.series.values())]
    if not panels:
        return None
    fig = Figure(figsize=(7 * len(panels), 4.8), dpi=110)
    FigureCanvasAgg(fig)
    for i, panel in enumerate(panels, start=1):
        _draw(fig.add_subplot(1, len(panels), i), panel)
    fig.tight_layout()
    fig.savefig(path)
    return path


def cdf_plot(
    series: Mapping[str, Sequence[float]], title: str, xlabel: str, path: Path
) -> Path | None:
    return cdf_figure([Panel(title, xlabel, series)], path)
