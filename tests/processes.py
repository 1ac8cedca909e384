"""The processes a test started, from /proc (no psutil dependency): tests leave none behind."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def with_text_in_command_line(text: str) -> set[int]:
    """Every live process whose command line contains `text`, wherever it was reparented."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != str(os.getpid()):
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in command and alive(int(entry)):
                found.add(int(entry))
    return found


def kill_after_logged_steps(process, metrics: Path, steps: int, timeout_s: float = 240) -> set[int]:
    """SIGKILL the training `process` (started in a session of its own) once `metrics`
    holds `steps` lines; returns the process and everything it had started, for the test to
    check that none outlives it."""
    import signal
    import time

    try:
        deadline = time.time() + timeout_s
        while time.time() < deadline and process.poll() is None:
            if metrics.exists() and metrics.read_text().count("\n") >= steps:
                break
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before it could be killed"
        family = descendants(process.pid) | {process.pid}
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    return family
