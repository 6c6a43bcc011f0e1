"""Wall time of `fleet-proxy`'s help commands, each in a fresh interpreter, as a user typing
them meets it: interpreter start, imports, argument parsing and the help text.

Each command runs `--runs` times with `sys.executable -m proxy.serving.cli ...`; the rounds
alternate the commands so that a burst of load on the machine spreads over all of them.
Figures depend on the machine and its load: print `/proc/loadavg` beside them.

    python scripts/perf/bench_cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS: tuple[tuple[str, ...], ...] = (
    ("--help",),
    ("serve", "--help"),
    ("reschedule", "--help"),
    ("plan", "--help"),
)


def run_once(args: tuple[str, ...]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "proxy.serving.cli", *args],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=15, help="fresh processes per command")
    args = p.parse_args()
    times: dict[tuple[str, ...], list[float]] = {c: [] for c in COMMANDS}
    for _ in range(args.runs):
        for command in COMMANDS:
            times[command].append(run_once(command))
    baseline = [run_once_python() for _ in range(args.runs)]
    width = max(len(" ".join(c)) for c in COMMANDS)
    for command, values in times.items():
        print(_line(f"fleet-proxy {' '.join(command):<{width}}", values))
    print(_line(f"{'python -c pass':<{width + 12}}", baseline))
    return 0


def run_once_python() -> float:
    """The interpreter's own start-up, for scale."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - started


def _line(label: str, values: list[float]) -> str:
    return (
        f"{label}: median {statistics.median(values):.3f} s "
        f"(min {min(values):.3f}, max {max(values):.3f}, {len(values)} runs)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
