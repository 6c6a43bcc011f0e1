"""Whether a child's process group holds the listening socket on a port (Linux /proc).

On a machine shared with other jobs, another process can take the free port picked for a
router between the pick and the router's bind; the router then exits, and whatever holds the
port answers its health route in its place. Asking the kernel who listens tells them apart."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # TCP state in /proc/net/tcp


def listening_inodes(port: int, proc: Path = PROC) -> set[str]:
    """Socket inodes listening on `port` (any address, IPv4 or IPv6)."""
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 9
                and fields[3] == LISTEN
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                found.add(fields[9])
    return found


def group_pids(leader: int, proc: Path = PROC) -> list[int]:
    """The live processes of the process group `leader` leads."""
    pids = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended since the listing
        if int(fields[2]) == leader:
            pids.append(int(stat.parent.name))
    return pids


def group_listens_on(leader: int, port: int, proc: Path = PROC) -> bool:
    """True when a process of the group holds the listening socket on `port`; True too where
    /proc cannot tell (not Linux), so the check never blocks a run there."""
    if not (proc / "net" / "tcp").exists():
        return True
    sockets = {f"socket:[{inode}]" for inode in listening_inodes(port, proc)}
    if not sockets:
        return False
    for pid in group_pids(leader, proc):
        try:
            fds = list((proc / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if str(fd.readlink()) in sockets:
                    return True
            except OSError:
                continue
    return False
