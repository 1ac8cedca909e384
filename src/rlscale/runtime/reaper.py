"""The reaper of an embedded Ray cluster: when the process that started it dies, even by
SIGKILL, every process of that cluster ends too, and its temporary folder goes.

Ray's processes notice a dead driver on their own, but slowly: its per-node agents
(`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) poll a dead raylet and retry a dead GCS for a
minute or more, reparented to init. The reaper is a small separate process started beside the
cluster (`python -m rlscale.runtime.reaper OWNER_PID TEMP_DIR`). It waits while its owner lives
and the folder exists; when the folder goes (a normal shutdown) it exits; when the owner goes
first, it ends the processes that belong to that cluster and removes the folder.

A process belongs to the cluster when its command line, working directory or any open file
names a path inside the cluster's own temporary folder (every Ray process of the session
holds its log files there). Never by a name pattern: another run's Ray, or a user's, is never
touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.5
GRACE_S = 2.0  # between SIGTERM and SIGKILL


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _names(pid: int, folder: str) -> bool:
    """Whether process `pid` names a path inside `folder` (command line, cwd, open files)."""
    proc = Path(f"/proc/{pid}")
    try:
        if folder in proc.joinpath("cmdline").read_bytes().decode(errors="replace"):
            return True
        if os.readlink(proc / "cwd").startswith(folder):
            return True
        for fd in os.listdir(proc / "fd"):
            try:
                if os.readlink(proc / "fd" / fd).startswith(folder):
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


def members(folder: str) -> list[int]:
    """The live processes (other than this one) that belong to the cluster in `folder`."""
    me = os.getpid()
    return [int(e) for e in os.listdir("/proc")
            if e.isdigit() and int(e) != me and _alive(int(e)) and _names(int(e), folder)]


def reap(folder: str) -> list[int]:
    """End the cluster's processes (SIGTERM, then SIGKILL after a grace period) and remove
    its folder; returns the PIDs it signalled."""
    targets = members(folder)
    for pid in targets:
        with _ignore_gone():
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(_alive(p) for p in targets):
        time.sleep(0.1)
    for pid in targets + members(folder):  # and any that started meanwhile
        if _alive(pid):
            with _ignore_gone():
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)
    return targets


class _ignore_gone:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, ProcessLookupError | PermissionError)


def watch(owner: int, folder: str) -> None:
    while os.path.isdir(folder):
        if not _alive(owner):
            reap(folder)
            return
        time.sleep(POLL_S)


if __name__ == "__main__":
    # Ctrl-C reaches the whole foreground group: the reaper outlives it to clean up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]), sys.argv[2])
