"""CDF plots, one line per compared setting, via matplotlib's object API on the Agg canvas
(no pyplot global state, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def cdf_plot(
    series: Mapping[str, Sequence[float]], title: str, xlabel: str, path: Path
) -> Path | None:
    """Write an empirical CDF per series; None when there is nothing to plot."""
    if not any(series.values()):
        return None
    fig = Figure(figsize=(7, 4.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, values in series.items():
        if not values:
            continue
        x = np.sort(np.asarray(values, dtype=float))
        y = np.arange(1, x.size + 1) / x.size
        ax.step(x, y, where="post", label=f"{label} (n={x.size})")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    return path
