"""The non-finite guard shared by both loops, and the watch for a run that learns nothing.

A step whose loss, gradient norm or KL is not finite is skipped (the loop restores the
weights it had before), counted as `health/skipped_steps` and warned about once; N such
steps in a row stop the run with a one-line error, after a checkpoint of the last good
state, so a diverged run is never silently trained on NaNs and never loses its good steps.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch


class NonFiniteError(RuntimeError):
    """Too many non-finite steps in a row: the run stopped (one-line message)."""


# health.nonfinite_guard. snapshot: copy the state a step changes before it (StepUndo) and put
# it back if the step goes non-finite. check: no copy (for models where one costs real memory
# and time); updates with a non-finite gradient are skipped by the optimiser step's own
# test, and weights that still go non-finite cannot be undone: the run stops at once, to be
# resumed from its last checkpoint. off: no test at all.
GUARD_MODES = ("snapshot", "check", "off")


def unrecoverable_message(what: str, step: int, run_dir: str) -> str:
    return (f"the weights went non-finite at {what} {step} and health.nonfinite_guard is "
            f"'check' (no snapshot to restore); nothing was saved from it -- resume {run_dir} "
            "from its last checkpoint with a lower learning rate (--resume "
            "--allow-config-change), or use health.nonfinite_guard=snapshot")


def non_finite_keys(metrics: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """Which of `keys` present in `metrics` hold a NaN or an infinity."""
    bad = []
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and not math.isfinite(value):
            bad.append(key)
    return bad


def parameters_finite(parameters: Iterable[Any]) -> bool:
    """Whether every element is finite, by each tensor's min and max: a NaN propagates to
    both, an infinity is one of them, so the test is exact; one reduction pass with no
    boolean copy, ~30x faster than `isfinite(p).all()` on this CPU (0.03 vs 0.87 s for 166 M
    parameters, one thread), which matters when it runs every step on a large model."""
    ends = [torch.stack(p.detach().aminmax()).float() for p in parameters if p.numel()]
    return not ends or bool(torch.isfinite(torch.stack(ends)).all())


def first_non_finite_parameter(module: torch.nn.Module) -> str | None:
    """The name of the first parameter holding NaN or inf, or None: one cheap pass over all
    of them, names only when one is bad. A damaged or diverged model found at load time,
    not deep inside sampling or search."""
    if parameters_finite(module.parameters()):
        return None
    return next(name for name, weight in module.named_parameters()
                if not parameters_finite([weight]))


class NonFiniteGuard:
    """Counts skipped steps and the current run of them; decides when to stop."""

    def __init__(self, max_in_a_row: int, what: str = "step") -> None:
        self.max_in_a_row, self.what = max_in_a_row, what
        self.skipped = 0
        self.in_a_row = 0
        self._warned = False

    def observe(self, step: int, bad: list[str]) -> bool:
        """Record step `step`'s verdict (`bad`: the non-finite figures); True if skipped."""
        if not bad:
            self.in_a_row = 0
            return False
        self.skipped += 1
        self.in_a_row += 1
        if not self._warned:
            self._warned = True
            print(f"warning: {self.what} {step}: non-finite {', '.join(bad)}; the update is "
                  f"skipped (counted in health/skipped_steps; {self.max_in_a_row} in a row stop "
                  "the run)", file=sys.stderr, flush=True)
        return True

    @property
    def should_stop(self) -> bool:
        return self.in_a_row >= self.max_in_a_row

    def stop_message(self, step: int, bad: list[str], checkpoint: str) -> str:
        return (f"{self.in_a_row} non-finite {self.what}s in a row (last: {self.what} {step}, "
                f"{', '.join(bad)}); the run stopped with the last good state in {checkpoint} "
                "-- lower the learning rate and resume with --allow-config-change")


@dataclass
class ZeroRewardWatch:
    """Steps in a row on which every sample's reward was 0. Such a step has nothing to learn
    from (every group is flat: no advantage), yet the run goes on and exits 0 -- a verifier
    that always fails, a task far beyond the model, answers cut off by the token budget.
    Warns once when a run of them reaches `patience` (0: never), and remembers the longest
    such run for the end summary."""

    patience: int
    in_a_row: int = 0
    longest: tuple[int, int] | None = None  # (first, last) step of the longest such run
    warned: bool = False

    def observe(self, step: int, all_zero: bool) -> str | None:
        """Record step `step`; the warning to print (once per run), or None."""
        self.in_a_row = self.in_a_row + 1 if all_zero else 0
        if not self.patience or self.in_a_row < self.patience:
            return None
        first = step - self.in_a_row + 1
        if self.longest is None or self.in_a_row > self.longest[1] - self.longest[0] + 1:
            self.longest = (first, step)
        if self.warned:
            return None
        self.warned = True
        return (f"step {step}: the reward was 0 for every sample of the last {self.in_a_row} "
                f"steps ({first}-{step}), so the run is learning nothing; check the verifier "
                "(reward/verifier_errors in metrics.jsonl), the task's difficulty and "
                "rollout.max_new_tokens")

    def summary(self) -> str | None:
        """What the end-of-run summary says about it, or None if it never happened."""
        if self.longest is None:
            return None
        first, last = self.longest
        return (f"the reward was 0 for every sample in steps {first}-{last} "
                f"({last - first + 1} in a row): those steps learned nothing")


def all_zero_reward(metrics: Mapping[str, Any]) -> bool:
    """Whether every sample of the step scored exactly 0: its mean and its spread are 0."""
    return metrics.get("reward/mean") == 0 and metrics.get("reward/std") == 0


class StepUndo:
    """The state one training step changes (trainable weights, buffers, optimiser state and
    learning rates, the scheduler), saved before the step and put back if it goes non-finite.

    Saved by copying into buffers allocated once, not by cloning a state dict every step: a
    `state_dict` clone plus `deepcopy` of the optimiser cost ~0.3 s per step at 31.5 M
    parameters on this project's CPU (several % of a step); in-place copies cost a memcpy.
    Frozen weights (LoRA's base) are never copied."""

    def __init__(self, model, optimizer, scheduler=None) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self._saved: list = []
        self._keys: list = []
        self._extra: dict = {}

    def _live(self) -> tuple[list, list]:
        """(keys, tensors) of the changing state, in a fixed order."""
        keys, tensors = [], []
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                keys.append(("param", name))
                tensors.append(p.data)
        for name, b in self.model.named_buffers():
            keys.append(("buffer", name))
            tensors.append(b)
        for group_index, group in enumerate(self.optimizer.param_groups):
            for param_index, p in enumerate(group["params"]):
                for key, value in self.optimizer.state.get(p, {}).items():
                    if hasattr(value, "copy_"):
                        keys.append(("state", group_index, param_index, key))
                        tensors.append(value)
        return keys, tensors

    def save(self) -> None:
        keys, tensors = self._live()
        if keys != self._keys:  # first save, or the optimiser state appeared: allocate
            self._keys, self._saved = keys, [t.detach().clone() for t in tensors]
        else:
            for saved, live in zip(self._saved, tensors, strict=True):
                saved.copy_(live)
        self._extra = {
            "lrs": [group["lr"] for group in self.optimizer.param_groups],
            "has_state": {id(p) for p in self.optimizer.state},
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict()}

    def restore(self) -> None:
        # Optimiser state created by the undone step (its first) is dropped again.
        for p in [p for p in self.optimizer.state if id(p) not in self._extra["has_state"]]:
            del self.optimizer.state[p]
        keys, tensors = self._live()
        saved = dict(zip(self._keys, self._saved, strict=True))
        with torch.no_grad():
            for key, live in zip(keys, tensors, strict=True):
                live.copy_(saved[key])
        for group, lr in zip(self.optimizer.param_groups, self._extra["lrs"], strict=True):
            group["lr"] = lr
        if self.scheduler is not None:
            self.scheduler.load_state_dict(self._extra["scheduler"])


class StepUndos:
    """Several models' StepUndo saved and put back together: a policy's and its critic's
    (PPO), so an undone step leaves neither trained on it."""

    def __init__(self, *undos: StepUndo) -> None:
        self.undos = undos

    def save(self) -> None:
        for undo in self.undos:
            undo.save()

    def restore(self) -> None:
        for undo in self.undos:
            undo.restore()
