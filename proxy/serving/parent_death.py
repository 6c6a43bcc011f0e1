"""Child processes that do not outlive their parent, however it ends (SIGKILL included): the
kernel sends them a signal when it goes (Linux `prctl(PR_SET_PDEATHSIG)`). `fleet-proxy serve
--workers N` gives it to its workers, `fleet-proxy demo` to its simulator."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the parent goes; if it already has, go now. Called in
    the child: first thing in its main, or as Popen's `preexec_fn` (between fork and exec; the
    request outlives the exec). `parent` is the parent's pid, read before the child started.

    The kernel sends it when the thread that started the child ends: start children from the
    thread that lives as long as the parent process (its main thread)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
