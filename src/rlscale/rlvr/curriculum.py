"""Which prompts a step trains on: drawn uniformly from the task, or by a curriculum over
their difficulty that follows the groups' success rates (`rollout.curriculum`).

A group whose G rewards are all equal carries no gradient (zero advantage): prompts the
policy always or never solves are wasted compute. The learnability curriculum keeps a
running success rate `p_d` per difficulty level `d` (the task's `difficulty(example)`, e.g.
the number of terms of a chain) and draws level `d` with probability proportional to
`p_d (1 - p_d)`, the variance of a reward at that level, which is what a group's baseline
can turn into a gradient (as in Foster and Foerster 2025, "Learning to Reason at the
Frontier of Learnability"; DAPO's dynamic sampling drops the zero-variance groups after
drawing them, this avoids drawing them). A floor keeps every level in play so a mastered or
hopeless level is noticed when it changes. Then a prompt of the level is drawn from the
task's own sampler, by rejection.

The synchronous loop folds in each step's groups; the fleets (runtime.mode async, inflight)
draw a prompt per group as they admit it and fold in every P finished groups as one step,
from the orchestrator's thread: a lock makes the curriculum safe to share with the loop,
which saves its state in checkpoints.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import torch

from .tasks.base import Example, Task

CURRICULA = ("uniform", "learnability")
PROBE_PROMPTS = 512      # drawn once to find the task's difficulty levels
FLOOR = 0.02             # every level's weight at least this (p(1-p) is at most 0.25)
MAX_TRIES = 2000         # draws to find a prompt of the chosen level


def learnability(rate: float) -> float:
    """`p (1 - p)`, floored: the reward variance of a level with success rate `p`."""
    return max(rate * (1.0 - rate), FLOOR)


class LearnabilityCurriculum:
    """Difficulty levels weighted by learnability, their success rates followed by an
    exponential moving average (`ema`: the weight of the newest step)."""

    def __init__(self, task: Task, *, ema: float, seed: int) -> None:
        if not hasattr(task, "difficulty"):
            raise ValueError(f"rollout.curriculum learnability needs a task with difficulty "
                             f"levels; task '{getattr(task, 'name', task)}' has none")
        probe = random.Random(seed)
        self.levels = sorted({task.difficulty(task.sample("train", probe))
                              for _ in range(PROBE_PROMPTS)})
        self.rates = {level: 0.5 for level in self.levels}  # unknown: the most learnable
        self.ema = ema
        self.task = task
        self._lock = threading.Lock()  # the fleets update it from their orchestrator thread

    def weights(self) -> list[float]:
        return [learnability(self.rates[level]) for level in self.levels]

    def sample(self, rng: random.Random, n: int) -> list[Example]:
        """`n` training prompts: a level each by learnability, then a prompt of it."""
        with self._lock:
            weights = self.weights()
        chosen = rng.choices(self.levels, weights=weights, k=n)
        return [self._draw_at(level, rng) for level in chosen]

    def _draw_at(self, level, rng: random.Random) -> Example:
        for _ in range(MAX_TRIES):
            example = self.task.sample("train", rng)
            if self.task.difficulty(example) == level:
                return example
        return example  # a level too rare to find: any prompt rather than none

    def update(self, examples: Sequence[Example], rewards: torch.Tensor,
               group_size: int) -> dict[str, float]:
        """Fold a step's groups (one example per group, `rewards` `[N * G]`) into the
        levels' success rates; returns the step's curriculum figures."""
        per_group = rewards.detach().float().view(-1, group_size).mean(dim=1).tolist()
        seen: dict = {}
        for example, rate in zip(examples, per_group, strict=True):
            seen.setdefault(self.task.difficulty(example), []).append(rate)
        with self._lock:
            for level, rates in seen.items():
                if level in self.rates:
                    mean = sum(rates) / len(rates)
                    self.rates[level] = (1 - self.ema) * self.rates[level] + self.ema * mean
            weights, rates_now = self.weights(), dict(self.rates)
        figures = {}
        for level, weight in zip(self.levels, weights, strict=True):
            figures[f"curriculum/rate_{level}"] = rates_now[level]
            figures[f"curriculum/weight_{level}"] = weight / sum(weights)
        figures["curriculum/mean_level"] = sum(
            float(level) * len(rates) for level, rates in seen.items()) / max(len(per_group), 1)
        return figures

    def state(self) -> dict:
        with self._lock:
            return {"levels": list(self.levels),
                    "rates": [self.rates[lvl] for lvl in self.levels]}

    def load(self, state: dict) -> None:
        if list(state["levels"]) != list(self.levels):
            raise ValueError(f"the checkpoint's curriculum levels {state['levels']} are not "
                             f"this task's {self.levels}")
        with self._lock:
            self.rates = dict(zip(self.levels, state["rates"], strict=True))


def make_curriculum(name: str, task: Task, *, ema: float,
                    seed: int) -> LearnabilityCurriculum | None:
    """The `rollout.curriculum` named `name` (None: uniform, the task's own sampler)."""
    if name == "uniform":
        return None
    if name == "learnability":
        return LearnabilityCurriculum(task, ema=ema, seed=seed)
    raise ValueError(f"unknown rollout.curriculum '{name}' (known: {', '.join(CURRICULA)})")
