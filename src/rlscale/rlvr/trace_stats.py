"""What completions did, beyond their reward: the task's behaviour counters (for tasks with
reasoning traces), the length of right and of wrong completions, and both by difficulty.

Shared by the training loop (per step) and held-out evaluation (`rlvr eval --json`), so a
report compares the same figures before and after RL.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from .tasks import Example, Task


def behaviour_means(task: Task, texts: Sequence[str], examples: Sequence[Example]
                    ) -> dict[str, float]:
    """The mean of each of the task's behaviour counters over the completions (`behaviour/
    <name>`); empty for a task without `behaviour(completion, example)`."""
    counters = getattr(task, "behaviour", None)
    if counters is None or not texts:
        return {}
    sums: dict[str, float] = defaultdict(float)
    for text, example in zip(texts, examples, strict=True):
        for name, value in counters(text, example).items():
            sums[name] += float(value)
    return {f"behaviour/{name}": total / len(texts) for name, total in sums.items()}


def length_by_outcome(lengths: Sequence[int], correct: Sequence[bool]) -> dict[str, float]:
    """Mean completion length of the right and of the wrong completions (`length/right_mean`,
    `length/wrong_mean`), each only when there is one."""
    out: dict[str, float] = {}
    for name, want in (("right", True), ("wrong", False)):
        chosen = [n for n, ok in zip(lengths, correct, strict=True) if ok == want]
        if chosen:
            out[f"length/{name}_mean"] = sum(chosen) / len(chosen)
    return out


def by_difficulty(task: Task, examples: Sequence[Example], lengths: Sequence[int],
                  correct: Sequence[bool]) -> dict[str, float]:
    """Accuracy and mean length per difficulty level (`difficulty/<level>/accuracy`, ...
    `/mean_length`, `/share`) for a task with `difficulty(example)`; else empty."""
    level_of = getattr(task, "difficulty", None)
    if level_of is None or not examples:
        return {}
    rows: dict[int, list[tuple[int, bool]]] = defaultdict(list)
    for example, n, ok in zip(examples, lengths, correct, strict=True):
        rows[level_of(example)].append((n, ok))
    out: dict[str, float] = {}
    for level in sorted(rows):
        items = rows[level]
        out[f"difficulty/{level}/accuracy"] = sum(ok for _, ok in items) / len(items)
        out[f"difficulty/{level}/mean_length"] = sum(n for n, _ in items) / len(items)
        out[f"difficulty/{level}/share"] = len(items) / len(examples)
    return out


def mean_by_difficulty(task: Task, examples: Sequence[Example], values: Sequence[float],
                       name: str) -> dict[str, float]:
    """The mean of `values` (one per completion) per difficulty level
    (`difficulty/<level>/<name>`) for a task with `difficulty(example)`; else empty."""
    level_of = getattr(task, "difficulty", None)
    if level_of is None or not examples:
        return {}
    rows: dict[int, list[float]] = defaultdict(list)
    for example, value in zip(examples, values, strict=True):
        rows[level_of(example)].append(float(value))
    return {f"difficulty/{level}/{name}": sum(v) / len(v) for level, v in sorted(rows.items())}
