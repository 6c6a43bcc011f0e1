"""scripts/compare_peers.py end to end with fleet-proxy's own policies: a real simulated fleet
and real proxies on free ports, started and stopped by the script."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import orjson

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "compare_peers.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare_peers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def test_a_policy_on_a_fresh_fleet_gives_the_table_plot_and_costs(tmp_path: Path) -> None:
    peers = load_script()
    out = tmp_path / "peers"
    code = peers.main(
        [
            "--engines",
            "2",
            "--speed",
            "5",
            "--out",
            str(out),
            "--settings",
            "fleet-proxy:round_robin,vllm-router:no_such_policy",
            "--",
            "--workload",
            "chat",
            "--sessions",
            "3",
            "--turns",
            "2",
            "--system-tokens",
            "64",
            "--user-tokens",
            "16",
            "--output-tokens",
            "4",
            "--concurrency",
            "3",
        ]
    )
    assert code == 0
    table = (out / "peers.md").read_text()
    assert "| fleet-proxy:round_robin | 6 | 0 |" in table
    # A router that refuses its flags is reported, not fatal.
    assert "Not run: vllm-router:no_such_policy" in table
    assert (out / "peers.png").read_bytes()[:4] == b"\x89PNG"
    result = orjson.loads((out / "peers.json").read_bytes())
    assert list(result["skipped"]) == ["vllm-router:no_such_policy"]
    for tag in ("fleet-proxy-round_robin-0",):
        bundle = out / "runs" / tag
        costs = orjson.loads((bundle / "costs.json").read_bytes())
        assert costs["router_cpu_s"] is not None and len(costs["sim_lag_fraction"]) == 2
        records = [orjson.loads(x) for x in (bundle / "metrics.jsonl").read_bytes().splitlines()]
        assert all(r["error"] is None and r["backend"] for r in records)
    # Round robin over two engines: both served; the snapshots saw the requests.
    rr = orjson.loads((out / "runs" / "fleet-proxy-round_robin-0" / "summary.json").read_bytes())
    assert rr["runs"][0]["balance"]["requests_max_over_min"] is not None
    assert rr["runs"][0]["backend_metrics"]["prefix_queries"] > 0
