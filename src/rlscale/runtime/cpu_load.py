"""How crowded the cores are while something is timed: Linux's count of tasks running or
ready to run (/proc/loadavg), sampled in a thread while a `CrowdWatch` is open.

A timing taken while other processes want the cores measures them as much as the code: the
precision probe, timed beside two experiment workers on 2 cores, once measured emulated bf16
1.39x faster than fp32. Such a timing is not worth keeping; `crowded` says when to distrust
it. A sample counts the timed code's own threads and every other task, not the sampling
thread itself (it runs while it reads)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

LOADAVG = Path("/proc/loadavg")
SAMPLE_SECONDS = 0.01
# Tasks beyond the cores, on average, before the cores count as crowded: a transient task
# (a shell, a log flush) is not a crowd.
SLACK = 0.5


def runnable_tasks(loadavg: str) -> int | None:
    """The running-or-runnable task count in /proc/loadavg's text (`0.5 0.4 0.3 3/250
    1234`: 3); None where the text is not that."""
    try:
        return int(loadavg.split()[3].split("/")[0])
    except (IndexError, ValueError):
        return None


def crowded(mean_runnable: float | None, cores: int) -> bool:
    """Whether tasks wanted more cores than there are, on average, while timing; unknown
    (None) is not crowded."""
    return mean_runnable is not None and mean_runnable > cores + SLACK


class CrowdWatch:
    """`with CrowdWatch() as watch: ...` samples the runnable-task count (less the sampler)
    until the block ends; then `watch.mean` is its mean (None without /proc/loadavg) and
    `watch.crowded` says whether the cores were crowded."""

    def __init__(self, cores: int | None = None, path: Path = LOADAVG) -> None:
        self.cores = cores or os.cpu_count() or 1
        self.path = path
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="crowd-watch", daemon=True)

    def _sample(self) -> None:
        try:
            count = runnable_tasks(self.path.read_text())
        except OSError:
            count = None
        if count is not None:
            self.samples.append(max(count - 1, 0))  # not the sampling thread

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self._sample()

    def __enter__(self) -> CrowdWatch:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None

    @property
    def crowded(self) -> bool:
        return crowded(self.mean, self.cores)
