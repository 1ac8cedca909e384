"""The records of a quickstart: its recipe (configs, splits, sampling) and what a run of it
made and measured, which the reports (quickstart.py, emergence_report.py) read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .evaluate import EvalResult
from .tasks import Task


@dataclass(frozen=True)
class Recipe:
    name: str
    sft_config: str               # under configs/rlvr/
    rl_config: str
    splits: tuple[str, ...]       # measured before and after
    samples: int                  # per prompt
    ks: tuple[int, ...]
    prompts: int = 500
    default_out: str = "runs/quickstart"
    # fewer prompts for some splits (smollm's ood split, whose completions run longer)
    prompts_by_split: tuple[tuple[str, int], ...] = ()

    def prompts_of(self, split: str) -> int:
        return dict(self.prompts_by_split).get(split, self.prompts)


@dataclass
class QuickstartRun:
    recipe: Recipe
    out: Path
    base_path: Path
    final_path: Path
    task: Task
    rl_steps: int
    temperature: float
    eval_dtype: str                 # eval.compute_dtype of the measurements
    before: dict[str, EvalResult]   # by split
    after: dict[str, EvalResult]
    sft_seconds: float
    grpo_seconds: float
    total_seconds: float
