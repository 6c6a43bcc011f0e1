"""Child processes of the benchmark scripts: free loopback ports, a process stopped by its PID
when its block ends, and a wait for an HTTP endpoint to answer 200."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # last: a tree given in PYTHONPATH keeps its own modules

from proxy.serving.parent_death import die_with_parent  # noqa: E402


def free_ports(n: int) -> list[int]:
    """n + 1 consecutive free ports (the simulator takes a base port)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(base, base + n + 1))
    raise RuntimeError("no run of free ports")


@contextlib.contextmanager
def process(
    cmd: list[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    own_session: bool = False,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `cmd` (output to `log`) for the block; then SIGTERM it by its PID, SIGKILL if it
    is still there after 15 s. `own_session`: a Ctrl-C in the terminal reaches only this
    script, which then stops the process itself, in its own order."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **env} if env else None,
            start_new_session=own_session,
            # Gone with this script however it ends, SIGKILL included.
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


class ChildExited(RuntimeError):
    """The process that was to answer ended first; the message ends with its last log lines."""


def last_lines(log: Path, n: int = 10) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no log)"


def wait_http(
    url: str,
    limit: float = 60.0,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Until `url` answers 200. With `proc` (and its `log`): ChildExited as soon as that
    process has ended (a port taken from under it, a bad flag), not after `limit`."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if proc is not None and (code := proc.poll()) is not None:
            said = last_lines(log) if log is not None else ""
            raise ChildExited(
                f"{' '.join(map(str, proc.args))} exited with {code} before {url} answered; "
                f"its last lines{f' ({log})' if log else ''}:\n{said}"
            )
        time.sleep(0.2)
    raise RuntimeError(f"{url} never answered 200")
