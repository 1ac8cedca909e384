"""The run skeleton (runtime/run.py) with a toy experience source and learner: the guard
(snapshot undo, check, stop after N in a row), checkpoints every K steps and after the last,
and a resume from the last checkpoint that ends where an uninterrupted run does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlscale.config import NonFiniteGuardConfig
from rlscale.runtime import checkpoint as ckpt
from rlscale.runtime.health import NonFiniteError, StepUndo, parameters_finite
from rlscale.runtime.metrics import Heartbeat, MetricsLogger, StepProgress
from rlscale.runtime.run import Schedule, drive


class CountingSource:
    """Batches 1, 2, 3, ... (the target the learner regresses to), and the weights it got."""

    def __init__(self) -> None:
        self.published: list[int] = []

    def next_batch(self, step: int) -> float:
        return float(step + 1)

    def publish(self, state_dict, version: int) -> None:
        self.published.append(version)


class ToyLoop:
    """One weight, SGD on (w - batch)^2; `poison` names steps whose update goes NaN."""

    def __init__(self, run_dir: Path, poison: set[int] = frozenset(), every: int = 2) -> None:
        self.run_dir, self.poison, self.checkpoint_every = run_dir, poison, every
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.optimizer = torch.optim.SGD([self.weight], lr=0.1)
        self.undo = StepUndo(torch.nn.ParameterList([self.weight]), self.optimizer)
        self.source, self.step, self.version = CountingSource(), 0, 0
        self.max_minutes = None
        self.after: list[int] = []

    @property
    def done(self) -> int:
        return self.step

    def begin_step(self) -> None:
        pass

    def learn(self, beat) -> float:
        target = self.source.next_batch(self.step)
        loss = (self.weight - target) ** 2
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if self.step + 1 in self.poison:
            with torch.no_grad():
                self.weight.fill_(float("nan"))
        return float(loss)

    def nonfinite(self, loss: float) -> list[str]:
        return [] if parameters_finite([self.weight]) else ["weights"]

    def finish(self, loss: float, undone: bool, publish: bool = True) -> dict:
        self.step += 1
        if publish and not undone:
            self.version += 1
            self.source.publish({"w": self.weight.detach().clone()}, self.version)
        return {"loss": loss, "weight": float(self.weight)}

    def after_step(self, metrics: dict) -> None:
        self.after.append(self.step)

    def histograms(self, loss: float) -> dict:
        return {}

    def progress_fields(self, metrics: dict) -> dict:
        return {}

    def save_checkpoint(self) -> Path:
        path = ckpt.checkpoint_path(self.run_dir, self.step)
        with ckpt.atomic_dir(path) as tmp:
            (tmp / "state.json").write_text(json.dumps(
                {"step": self.step, "weight": float(self.weight), "version": self.version}))
        return path

    def load(self, path: Path) -> None:
        state = json.loads((path / "state.json").read_text())
        self.step, self.version = state["step"], state["version"]
        with torch.no_grad():
            self.weight.fill_(state["weight"])

    def save_snapshot(self) -> None:
        pass


def run(loop: ToyLoop, total: int, mode: str = "snapshot", max_in_a_row: int = 3,
        resume_step: int | None = None):
    health = NonFiniteGuardConfig(nonfinite_guard=mode, max_nonfinite_steps=max_in_a_row)
    logger = MetricsLogger(loop.run_dir, tensorboard=False, resume_step=resume_step)
    try:
        return drive(loop, Schedule(total, health, loop.run_dir), logger,
                     StepProgress(total, "toy", enabled=False), Heartbeat("toy", enabled=False))
    finally:
        logger.close()


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_clean_run_steps_publishes_logs_and_checkpoints(tmp_path):
    loop = ToyLoop(tmp_path)
    outcome = run(loop, 5)
    assert outcome.skipped == 0 and loop.step == 5
    assert loop.source.published == [1, 2, 3, 4, 5]
    assert [r["step"] for r in logged(tmp_path)] == [1, 2, 3, 4, 5]
    assert loop.after == [1, 2, 3, 4, 5]
    # every 2 steps, and after the last
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)][-3:] == [
        "step_000002", "step_000004", "step_000005"]
    assert outcome.metrics["step"] == 5


def test_a_snapshot_guard_undoes_a_poisoned_step_and_goes_on(tmp_path):
    clean = ToyLoop(tmp_path / "clean")
    run(clean, 4)
    loop = ToyLoop(tmp_path / "poisoned", poison={3})
    outcome = run(loop, 4)
    assert outcome.skipped == 1
    assert parameters_finite([loop.weight])
    assert loop.source.published == [1, 2, 3]  # the undone step published nothing
    rows = logged(loop.run_dir)
    assert [r["health/skipped_steps"] for r in rows] == [0, 0, 1, 1]
    assert rows[2]["weight"] == rows[1]["weight"]  # step 3 left the weight where step 2 did


def test_the_guard_stops_after_n_in_a_row_with_a_checkpoint_to_resume_from(tmp_path):
    loop = ToyLoop(tmp_path, poison={3, 4}, every=10)
    with pytest.raises(NonFiniteError, match="2 non-finite steps in a row"):
        run(loop, 6, max_in_a_row=2)
    saved = ckpt.latest_checkpoint(tmp_path)
    assert saved is not None and saved.name == "step_000004"
    assert json.loads((saved / "state.json").read_text())["weight"] == pytest.approx(
        logged(tmp_path)[1]["weight"])  # the last good weight, from step 2


def test_check_mode_stops_at_once_on_non_finite_weights(tmp_path):
    loop = ToyLoop(tmp_path, poison={2})
    with pytest.raises(NonFiniteError, match="step 2"):
        run(loop, 5, mode="check")
    assert loop.source.published == [1]  # nothing published after the bad step
    assert [r["step"] for r in logged(tmp_path)] == [1, 2]  # the bad step is logged


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    whole = ToyLoop(tmp_path / "whole")
    run(whole, 6)
    first = ToyLoop(tmp_path / "resumed")
    run(first, 3)  # stops after step 3 (checkpoints at 2 and 3)
    second = ToyLoop(tmp_path / "resumed")
    second.load(ckpt.latest_checkpoint(second.run_dir))
    run(second, 6, resume_step=second.step)
    assert float(second.weight) == float(whole.weight)
    assert [r["step"] for r in logged(second.run_dir)] == [1, 2, 3, 4, 5, 6]
