"""A PostgreSQL server of the test's own: Debian's `postgresql` binaries, a cluster in a temp
dir, listening on a free loopback port, stopped by its PID. Run as the `postgres` user when the
tests run as root (PostgreSQL refuses to run as root). Skips the test where the binaries are
not installed (`apt-get install postgresql`; .ci/run installs it)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import free_port

_BINARIES = Path("/usr/lib/postgresql")


def _bindir() -> Path | None:
    found = sorted(_BINARIES.glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """The server's URL (user `fleet`, trusted, database `postgres`), for as long as the
    context lasts."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("Debian's postgresql is not installed (apt-get install postgresql)")
    tmp = Path(tempfile.mkdtemp(prefix="fleet-proxy-pg-"))
    as_user: dict[str, Any] = {}
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
        as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    data = tmp / "data"
    log = tmp / "server.log"
    server: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [bindir / "initdb", "-D", data, "-U", "fleet", "--auth=trust", "-E", "UTF8",
             "--no-sync"],
            check=True, capture_output=True, timeout=120, **as_user,
        )  # fmt: skip
        port = free_port()
        with log.open("wb") as out:
            server = subprocess.Popen(
                [bindir / "postgres", "-D", data, "-p", str(port), "-k", tmp,
                 "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                stdout=out, stderr=subprocess.STDOUT, **as_user,
            )  # fmt: skip
        url = f"postgresql://fleet@127.0.0.1:{port}/postgres"
        _wait_ready(url, server, log)
        yield url
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_ready(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    import psycopg

    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"postgres exited at start-up: {log.read_text()[-2000:]}")
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
