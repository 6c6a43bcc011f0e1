"""The log format every fleet-proxy process (proxy, worker, endpoint picker, rescheduler,
planner) starts with."""

from __future__ import annotations

import logging


def configure_logging(level: str, tag: str = "") -> None:
    """Log at `level` to stderr, each line with its time, level, `tag` (e.g. "[worker 1] ")
    and logger name. httpx logs one line per request, which with a scrape every 200 ms per
    engine would drown everything else: it logs warnings only."""
    logging.basicConfig(
        level=level.upper(), format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
