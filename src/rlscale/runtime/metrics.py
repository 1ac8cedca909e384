"""Per-step metrics: one JSON object per line in metrics.jsonl, mirrored to TensorBoard and to
the experiment trackers the run turned on (trackers.py)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .checkpoint import atomic_write_text, write_error, write_failure
from .trackers import Tracker


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _scalar(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class MetricsLogger:
    def __init__(
        self, run_dir: str | Path, *, tensorboard: bool = True, resume_step: int | None = None,
        trackers: Sequence[Tracker] = (),
    ) -> None:
        self.run_dir = Path(run_dir)
        self.trackers = list(trackers)  # closed by close()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if self.path.exists():
            # A resumed run repeats the steps after its checkpoint; drop their old lines so
            # every step appears exactly once. A fresh run starts a fresh file.
            keep = []
            if resume_step is not None:
                for line in self.path.read_text().splitlines():
                    try:
                        if json.loads(line).get("step", 0) <= resume_step:
                            keep.append(line)
                    except json.JSONDecodeError:
                        continue  # a line torn by a kill mid-write
            # Written beside and swapped in: a full disk mid-write must not cost the old lines.
            try:
                atomic_write_text(self.path, "".join(f"{line}\n" for line in keep))
            except OSError as exc:
                raise self._write_error(exc) from None
        self._file = open(self.path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=(
                resume_step + 1 if resume_step is not None else None))

    def _write_error(self, exc: OSError) -> BaseException:
        reason = write_failure(exc)
        if reason is None:
            return exc
        return write_error(self.path, reason, 0, "the lines before are kept; free space, then "
                           "run again with --resume")

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        try:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        except OSError as exc:
            raise self._write_error(exc) from None
        scalars = {k: v for k, v in row.items() if k != "step" and _scalar(v)}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
        for tracker in self.trackers:
            tracker.log(step, scalars)
        return row

    def log_histogram(self, step: int, name: str, values: Any) -> None:
        if self._tb is not None:
            self._tb.add_histogram(name, values, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        trackers, self.trackers = self.trackers, []
        _close_all(trackers)


def _close_all(trackers: list[Tracker]) -> None:
    """Close every tracker, even when one fails (its error is raised after the others)."""
    if trackers:
        try:
            trackers[0].close()
        finally:
            _close_all(trackers[1:])


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _live(fields: tuple[str, ...], values: dict[str, Any]) -> str:
    return "  ".join(f"{k} {values[k]:.3g}" for k in fields
                     if isinstance(values.get(k), int | float) and not isinstance(values[k], bool))


def progress_line(description: str, completed: int, total: int, rate: float | None,
                  live: str) -> str:
    """One self-contained log line: where the run is, how fast, when it ends, how it does."""
    pct = 100.0 * completed / max(total, 1)
    speed = f"{rate:.3g} steps/s" if rate else "- steps/s"
    eta = _clock((total - completed) / rate) if rate else "-"
    return f"{description}: step {completed}/{total} ({pct:.0f}%)  {speed}  ETA {eta}" + (
        f"  {live}" if live else "")


class StepProgress:
    """Progress of a run: a rich bar in a terminal; plain lines in a log file or pipe.

    In a terminal the step count and ETA come first, so an 80-column window cuts the live
    figures, not them. Elsewhere (stdout redirected) a full line is printed at the first
    step, then at most once per `every_s` seconds, and at the end: readable in `tail -f`
    and never truncated. Silent when disabled."""

    def __init__(self, total: int, description: str, *, enabled: bool = True,
                 completed: int = 0, fields: tuple[str, ...] = (), every_s: float | None = None,
                 stream: Any = None, clock: Any = time.monotonic) -> None:
        self.total, self.description, self.fields = total, description, fields
        self.stream = stream if stream is not None else sys.stdout
        self.clock = clock
        self.every_s = every_s if every_s is not None else float(
            os.environ.get("RLSCALE_PROGRESS_EVERY_S", "30"))
        self._progress = None
        self._plain = False
        self._start, self._start_step = clock(), completed
        self._last_print: float | None = None
        self._last_line: tuple[int, str] | None = None
        self._completed, self._live = completed, ""
        if not enabled:
            return
        if not getattr(self.stream, "isatty", lambda: False)():
            self._plain = True
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.table import Column

        console = Console(file=self.stream)
        # Fixed columns first and never squeezed; the live figures get what is left.
        counter = 2 * len(str(total)) + 1
        live_width = max(8, console.width - 45 - counter)
        fixed = {"no_wrap": True, "overflow": "ellipsis"}
        self._progress = Progress(
            TextColumn("[bold]{task.description}", table_column=Column(max_width=20, **fixed)),
            MofNCompleteColumn(table_column=Column(min_width=counter, **fixed)),
            TextColumn("ETA", table_column=Column(**fixed)),
            TimeRemainingColumn(table_column=Column(min_width=7, **fixed)),
            BarColumn(bar_width=10),
            TextColumn("{task.fields[live]}", table_column=Column(max_width=live_width, **fixed)),
            console=console, transient=False)
        self._task = self._progress.add_task(description, total=total, completed=completed,
                                             live="")
        self._progress.start()

    def update(self, completed: int, values: dict[str, Any]) -> None:
        self._completed, self._live = completed, _live(self.fields, values)
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, live=self._live)
        elif self._plain:
            now = self.clock()
            if self._last_print is None or now - self._last_print >= self.every_s:
                self._print(now)

    def _print(self, now: float) -> None:
        done = self._completed - self._start_step
        elapsed = now - self._start
        rate = done / elapsed if done > 0 and elapsed > 0 else None
        line = progress_line(self.description, self._completed, self.total, rate, self._live)
        self._last_print, self._last_line = now, (self._completed, line)
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif self._plain and (self._last_line is None or self._last_line[0] != self._completed):
            if self._completed > self._start_step:
                self._print(self.clock())


class Heartbeat:
    """Signs of life from work that prints nothing else for long (a match, an iteration's
    self-play, an evaluation): `beat(text)` prints `description: text (elapsed)` on stderr
    at most once every `every_s` seconds, the first after `every_s`; silent when disabled.
    Stderr, so a command's own output on stdout (a move, JSON) stays clean."""

    def __init__(self, description: str, *, every_s: float | None = None, enabled: bool = True,
                 stream: Any = None, clock: Any = time.monotonic) -> None:
        self.description, self.enabled, self.clock = description, enabled, clock
        self.every_s = every_s if every_s is not None else min(10.0, float(
            os.environ.get("RLSCALE_PROGRESS_EVERY_S", "10")))
        self.stream = stream
        self._start = self._last = clock()

    def beat(self, text: str) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if now - self._last >= self.every_s:
            self._last = now
            print(f"{self.description}: {text} ({_clock(now - self._start)})",
                  file=self.stream if self.stream is not None else sys.stderr, flush=True)
