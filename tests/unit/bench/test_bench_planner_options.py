"""scripts/bench_planner.py writes under --out only: its timeline plot goes to the docs' image
only when --plot names it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_planner.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_planner", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def test_the_plot_goes_under_out_unless_asked_elsewhere(tmp_path: Path) -> None:
    bench = load_script()
    args = bench.options(["--quick", "--out", str(tmp_path)])
    assert args.plot == tmp_path / "planner_timeline.png"
    docs_plot = SCRIPT.parents[1] / "docs" / "img" / "planner_timeline.png"
    assert bench.options(["--out", str(tmp_path), "--plot", str(docs_plot)]).plot == docs_plot
