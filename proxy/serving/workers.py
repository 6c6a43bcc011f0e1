"""`fleet-proxy serve --workers N`: N serving processes behind one port, one supervisor.

A single Python process tops out near one core; the proxy's per-request work is independent
between requests, so N processes can use N cores, as long as routing still sees the whole
proxy's load on every backend. The supervisor (this module) creates what the workers
share (proxy/control/peer_sync.py):
- a shared-memory segment with one row of per-backend load per worker (fleet/peer_load.py);
- a change log for the admin API's fleet changes (fleet/change_log.py), in a temp directory;
- boards where the first worker posts the metrics it scrapes and the health verdicts it
  reaches for all (fleet/metrics_board.py);
then binds the port (by default each worker listens on its own SO_REUSEPORT socket and the
kernel spreads new connections over them), starts the workers (multiprocessing, spawn: a fresh
interpreter, nothing inherited but the socket), prints the banner, and waits. SIGINT or
SIGTERM is passed on to every worker as SIGTERM (uvicorn's graceful stop) and the supervisor
returns when all have ended; a worker that ends on its own stops the rest and the supervisor
exits non-zero naming it. Workers also get SIGTERM from the kernel should the supervisor die
without a word (PR_SET_PDEATHSIG), so none outlives it.

Each worker keeps its own policy state (the prefix index above all), its own view of every
backend's health (from the first worker's checks) and its own /metrics; sessions and programs
need no sharing, every worker computes their rendezvous homes alike (policies/rendezvous.py):
see docs/performance.md.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from fleet.log_setup import configure_logging
from fleet.metrics_board import VERDICT_PAYLOAD, BoardLayout, BoardSegment
from fleet.peer_load import PeerLayout, PeerLoad, PeerSegment
from flowcontrol.rate_table import create_table_file
from proxy.control.peer_sync import WorkerSeat
from proxy.serving.front_door import (
    BACKLOG,
    SHUTDOWN_BACKSTOP_S,
    GracefulServer,
    fit_open_files,
    uvicorn_config,
)
from proxy.serving.parent_death import die_with_parent
from proxy.settings import Settings

# How long stopped workers may take, beyond their shutdown grace period and uvicorn's
# backstop, to stop their background work and exit before they are killed.
STOP_MARGIN_S = 5.0

ListenMode = Literal["shared", "reuseport"]  # as Settings.worker_listen


@dataclass(frozen=True, slots=True)
class Listen:
    """How a worker gets its listening socket: the supervisor's own (`shared`, one accept
    queue that idle workers take connections from), or one of its own bound with SO_REUSEPORT
    to the same port (`reuseport`, the kernel hashes each new connection to one worker)."""

    mode: ListenMode
    family: int
    address: tuple[Any, ...]
    sock: socket.socket | None = None

    def worker_socket(self) -> socket.socket:
        if self.mode == "shared":
            assert self.sock is not None
            return self.sock
        return listening_socket(self.family, self.address, reuse_port=True)


def bound_socket(family: int, address: tuple[Any, ...], *, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def listening_socket(family: int, address: tuple[Any, ...], *, reuse_port: bool) -> socket.socket:
    sock = bound_socket(family, address, reuse_port=reuse_port)
    sock.listen(BACKLOG)
    return sock


def resolve(host: str, port: int) -> tuple[int, tuple[Any, ...]]:
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return int(family), tuple(address)


def worker_main(
    settings_data: dict[str, Any], seat: WorkerSeat, listen: Listen, parent: int
) -> None:
    """One worker process: the same server as `run_serve` (proxy/serving/serve.py), on the
    shared port."""
    die_with_parent(parent)
    # Ctrl-C reaches the whole process group; the supervisor passes it on as SIGTERM, once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from proxy.serving.app import create_app

    settings = Settings(**settings_data)
    configure_logging(settings.log_level, f"[worker {seat.index}] ")
    app = create_app(settings, seat=seat)
    fit_open_files(settings.client_max_connections)
    server = GracefulServer(uvicorn_config(app, settings), settings.shutdown_grace_period, app.core)
    server.run(sockets=[listen.worker_socket()])
    if not server.started:
        sys.exit(3)  # as uvicorn's own CLI: the app or the socket failed at start-up


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor:
    def __init__(self, settings: Settings, listen_mode: ListenMode = "reuseport") -> None:
        self.settings = settings
        self.listen_mode = listen_mode
        self.workers: list[BaseProcess] = []
        self.stopping = False
        # `shared`: this process's copy of the socket every worker accepts on, once they have
        # all started with theirs.
        self._listener: socket.socket | None = None
        self._signals = 0
        # Workers finish their requests within the grace period, then exit.
        self.stop_grace = settings.shutdown_grace_period + SHUTDOWN_BACKSTOP_S + STOP_MARGIN_S

    def _on_signal(self, signum: int, _: FrameType | None) -> None:
        self._signals += 1
        self.stopping = True
        # A second signal: stop now, without waiting for requests to finish.
        sig = signal.SIGTERM if self._signals == 1 else signal.SIGKILL
        self._stop_listening()
        self._signal_workers(sig)

    def _stop_listening(self) -> None:
        """Close this process's copy of the shared listening socket: once the stopping workers
        have closed theirs, new connections are refused (a load balancer moves on) rather than
        queued where no worker will accept them."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _signal_workers(self, sig: int) -> None:
        for p in self.workers:
            if p.pid is not None and p.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)

    def _stop_all(self, grace: float) -> None:
        self._stop_listening()
        self._signal_workers(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.workers:
            p.join(max(0.0, deadline - time.monotonic()))
        if any(p.exitcode is None for p in self.workers):
            self._signal_workers(signal.SIGKILL)
            for p in self.workers:
                p.join()

    def run(self, banner: Callable[[int], str]) -> int:
        """Serve until a signal or a worker's death; `banner(port)` is printed once."""
        s = self.settings
        family, address = resolve(s.host, s.port)
        shared = self.listen_mode == "shared"
        try:
            if shared:
                # The one socket every worker accepts on.
                sock = listening_socket(family, address, reuse_port=False)
            else:
                # Held bound but never listening (so it takes no connections): it fixes the
                # port when port 0 was asked for, and the workers bind theirs beside it.
                sock = bound_socket(family, address, reuse_port=True)
        except OSError as e:
            print(f"fleet-proxy: cannot listen on {s.host}:{s.port}: {e}", file=sys.stderr)
            return 1
        port = int(sock.getsockname()[1])
        address = (address[0], port, *address[2:])
        listen = Listen(self.listen_mode, family, address, sock if shared else None)
        layout = PeerLayout(workers=s.workers)
        segment = PeerSegment(layout)
        board = BoardSegment(BoardLayout(slots=layout.slots))
        verdicts = BoardSegment(BoardLayout(slots=layout.slots, payload=VERDICT_PAYLOAD))
        tmp = Path(tempfile.mkdtemp(prefix="fleet-proxy-"))
        change_log = tmp / "fleet-changes.jsonl"
        change_log.touch()
        rate_table = tmp / "rate-limits.table"
        create_table_file(str(rate_table))
        settings_data = s.model_dump()
        # The workers share one store of Responses API responses, so a thread continues on
        # any worker: a file in a directory of its own, kept until the proxy stops (SQLite
        # opens files beside its database as it goes, so this one cannot go early like `tmp`).
        responses_dir: Path | None = None
        if s.responses_store_path is None and s.responses_store_url is None:
            responses_dir = Path(tempfile.mkdtemp(prefix="fleet-proxy-responses-"))
            settings_data["responses_store_path"] = responses_dir / "responses.sqlite3"
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        ctx = multiprocessing.get_context("spawn")
        try:
            for i in range(s.workers):
                seat = WorkerSeat(
                    i,
                    s.workers,
                    segment.name,
                    str(change_log),
                    metrics_board=board.name,
                    health_board=verdicts.name,
                    rate_table=str(rate_table),
                )
                p = ctx.Process(
                    target=worker_main,
                    args=(settings_data, seat, listen, os.getpid()),
                    name=f"fleet-proxy-worker-{i}",
                )
                p.start()
                self.workers.append(p)
                if self.stopping:
                    break
            if shared:
                self._listener = sock
                if self.stopping:
                    self._stop_listening()
            print(banner(port), flush=True)
            # A reader of the rows only (it never publishes): which workers have started.
            return self._wait(PeerLoad.attach(segment.name, 0), tmp)
        finally:
            self._stop_all(self.stop_grace)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            sock.close()
            segment.close()
            board.close()
            verdicts.close()
            shutil.rmtree(tmp, ignore_errors=True)
            if responses_dir is not None:
                shutil.rmtree(responses_dir, ignore_errors=True)

    def _wait(self, peers: PeerLoad, tmp: Path) -> int:
        """Until every worker has ended; 1 when one ended before being asked to."""
        try:
            return self._watch(peers, tmp)
        finally:
            peers.close()

    def _watch(self, peers: PeerLoad, tmp: Path) -> int:
        running = {p.sentinel: p for p in self.workers}
        started = False
        while running:
            if not started and all(row.pid for row in peers.rows()):
                # Every worker has its change log open (a worker's pid shows once it has
                # started): the name is no longer needed, and without it nothing is left on
                # disk even if this process is killed.
                shutil.rmtree(tmp, ignore_errors=True)
                started = True
            for sentinel in wait(list(running), timeout=0.1 if not started else 0.5):
                assert isinstance(sentinel, int)
                p = running.pop(sentinel)
                p.join()
                if not self.stopping:
                    index = self.workers.index(p)
                    print(
                        f"fleet-proxy: worker {index} (pid {p.pid}) {describe_exit(p.exitcode)}"
                        "; stopping the other workers",
                        file=sys.stderr,
                        flush=True,
                    )
                    self.stopping = True
                    self._stop_all(self.stop_grace)
                    return 1
        return 0


def run_workers(settings: Settings, banner: Callable[[int], str]) -> int:
    return Supervisor(settings, settings.worker_listen).run(banner)
