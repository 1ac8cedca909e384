"""The run skeleton both training loops are configurations of.

    for each step:
        snapshot the learner               (health.nonfinite_guard: snapshot)
        report = loop.learn(beat)          # experience -> learner updates
        bad = loop.nonfinite(report)       # the guard's verdict; restore or stop
        metrics = loop.finish(report, undone)   # counters, publish the weights, figures
        loop.after_step(metrics)           # a loop's own extras (held-out eval, warnings)
        log, progress, checkpoint every K, stop at the end or the time budget
    loop.save_final()

`drive` runs it once; the loops plug in what they add (zero/loop.py, rlvr/loop.py): their
experience source (in-process or a fleet behind one interface: rlvr/rollout_source.py,
zero/experience.py), their learner, their batch type and their metrics. The guard, the logger, trackers and progress,
the checkpoint cadence and the time budget live here, once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..config import NonFiniteGuardConfig
from .health import NonFiniteError, NonFiniteGuard, StepUndo, StepUndos, unrecoverable_message
from .metrics import Heartbeat, MetricsLogger, StepProgress


class Loop(Protocol):
    """What a training loop plugs into `drive`. `done` counts its finished steps."""

    @property
    def done(self) -> int: ...

    @property
    def undo(self) -> StepUndo | StepUndos: ...

    @property
    def checkpoint_every(self) -> int: ...  # 0: never (the loop's final save remains)

    @property
    def max_minutes(self) -> float | None: ...  # the wall-clock budget; None: none

    def begin_step(self) -> None: ...

    def learn(self, beat: Any) -> Any: ...

    def nonfinite(self, report: Any) -> list[str]: ...

    def finish(self, report: Any, undone: bool, publish: bool = True) -> dict[str, Any]: ...

    def after_step(self, metrics: dict[str, Any]) -> None: ...

    def histograms(self, report: Any) -> dict[str, Any]: ...

    def progress_fields(self, metrics: dict[str, Any]) -> dict[str, Any]: ...

    def save_checkpoint(self) -> Path: ...

    def save_snapshot(self) -> None: ...


@dataclass(frozen=True)
class Schedule:
    """How long a run goes (`total` steps), its non-finite guard, where it lives, and what
    a step is called in messages."""

    total: int
    health: NonFiniteGuardConfig
    run_dir: Path
    what: str = "step"


@dataclass(frozen=True)
class Outcome:
    """How `drive` ended: the last logged metrics and the steps the guard skipped."""

    metrics: dict[str, Any]
    skipped: int


def drive(loop: Loop, schedule: Schedule, logger: MetricsLogger, progress: StepProgress,
          heartbeat: Heartbeat) -> Outcome:
    """Step `loop` until `schedule.total` (or its time budget) with the guard, logging,
    progress and checkpoints: one every `loop.checkpoint_every` steps and one after the last
(or when the time budget runs out)."""
    guard = NonFiniteGuard(schedule.health.max_nonfinite_steps, what=schedule.what)
    mode = schedule.health.nonfinite_guard
    started = time.perf_counter()
    metrics: dict[str, Any] = {}
    while loop.done < schedule.total:
        loop.begin_step()
        if mode == "snapshot":
            loop.undo.save()
        report = loop.learn(heartbeat.beat)
        bad = [] if mode == "off" else loop.nonfinite(report)
        step = loop.done + 1
        if guard.observe(step, bad) and mode == "check" and "weights" in bad:
            logger.log(step, loop.finish(report, undone=True, publish=False))
            raise NonFiniteError(unrecoverable_message(schedule.what, step,
                                                       str(schedule.run_dir)))
        undone = bool(bad) and mode == "snapshot"
        if undone:
            loop.undo.restore()
        values = loop.finish(report, undone)
        values["health/skipped_steps"] = guard.skipped
        if guard.should_stop:
            logger.log(loop.done, values)
            # The weights are the last good ones again: a checkpoint to resume from.
            path = loop.save_checkpoint()
            raise NonFiniteError(guard.stop_message(loop.done, bad, str(path)))
        loop.after_step(values)
        metrics = logger.log(loop.done, values)
        for name, values_of in loop.histograms(report).items():
            logger.log_histogram(loop.done, name, values_of)
        progress.update(loop.done, loop.progress_fields(metrics))
        last = loop.done >= schedule.total
        budget = loop.max_minutes
        out_of_time = budget is not None and time.perf_counter() - started > 60 * budget
        loop.save_snapshot()
        every = loop.checkpoint_every
        if every and (loop.done % every == 0 or last or out_of_time):
            loop.save_checkpoint()
        if out_of_time:
            break
    return Outcome(metrics, guard.skipped)
