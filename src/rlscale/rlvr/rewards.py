"""Run verifiers safely, in worker processes: whatever a verifier does scores 0 and is counted.

A verifier sees model output, so it is untrusted code's playground: it may loop, raise, return
NaN, segfault in a C extension or allocate without bound. It therefore never runs in the
trainer's process but in a `WorkPool` (rlscale.runtime.workpool), under a per-call deadline
and an address-space limit; the trainer only ever receives a `ScoredBatch`.

How each outcome is counted:
- raised (including `MemoryError` from the memory limit) or non-finite reward -> `errors`
- ran past `timeout_s` (the worker is killed and replaced)                    -> `timeouts`
- the worker died (segfault, `os._exit`, killed; also an allocator that aborts
  rather than raising at the memory limit)                                    -> `crashes`
"""

from __future__ import annotations

import functools
import math
import pickle
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..runtime.workpool import DEFAULT_MEMORY_MB, Crash, Error, Ok, Outcome, Timeout, WorkPool
from .tasks import Example, Task

if TYPE_CHECKING:
    from .config import TaskConfig


@dataclass
class ScoredBatch:
    rewards: list[float]
    errors: int = 0
    timeouts: int = 0
    crashes: int = 0
    first_error: str | None = None  # one line, the first problem in batch order


def _reward(task: Task, completion: str, example: Example) -> float:
    """Runs in the worker: float() there, so only a plain float has to travel back."""
    reward = float(task.verify(completion, example))
    if not math.isfinite(reward):  # one NaN reward would turn the whole update to NaN
        raise ValueError(f"non-finite reward {reward}")
    return reward


def scored_batch(outcomes: Sequence[Outcome]) -> ScoredBatch:
    """Rewards from worker-pool outcomes: anything but `Ok` scores 0 and is counted."""
    out = ScoredBatch(rewards=[])
    for outcome in outcomes:
        problem = None
        match outcome:
            case Ok(value):
                out.rewards.append(value)
                continue
            case Timeout(seconds):
                out.timeouts += 1
                problem = f"verifier timed out after {seconds}s"
            case Crash():
                out.crashes += 1
                problem = f"verifier crashed: {outcome.describe()}"
            case Error(message):
                out.errors += 1
                problem = f"verifier raised {message}"
        out.rewards.append(0.0)
        out.first_error = out.first_error or problem
    return out


class VerifierPool:
    """`task.verify` in `workers` persistent processes; `score` is thread-safe.

    Create one per run and close it at the end (or use `with`); workers are stopped at
    interpreter exit in any case. Each worker uses one core while it scores, and none
    while idle.
    """

    def __init__(self, task: Task, *, workers: int = 1, timeout_s: float = 2.0,
                 memory_mb: int | None = DEFAULT_MEMORY_MB):
        try:
            pickle.dumps(task)
        except Exception as exc:
            raise TypeError(f"task '{getattr(task, 'name', task)}' must be picklable to run in "
                            f"verifier workers (defined at module level): {exc}") from None
        self.task = task
        self.timeout_s = timeout_s
        self._verify = functools.partial(_reward, task)
        self._pool = WorkPool(workers, timeout_s=timeout_s, memory_mb=memory_mb)

    @classmethod
    def from_config(cls, task: Task, config: TaskConfig) -> VerifierPool:
        return cls(task, workers=config.verifier_workers, timeout_s=config.verifier_timeout_s,
                   memory_mb=config.verifier_memory_mb)

    @property
    def pids(self) -> list[int]:
        return self._pool.pids

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> ScoredBatch:
        calls = list(zip(completions, examples, strict=True))
        return scored_batch(self._pool.map(self._verify, calls))

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


_shared_pool: WorkPool | None = None
_shared_lock = threading.Lock()


def _shared() -> WorkPool:
    # The pool is task-agnostic (the task travels with each chunk), so one serves every task.
    global _shared_pool
    with _shared_lock:
        if _shared_pool is None:
            _shared_pool = WorkPool(1)
        return _shared_pool


def score_completions(task: Task, completions: Sequence[str], examples: Sequence[Example],
                      timeout_s: float = 2.0) -> ScoredBatch:
    """One-off scoring in a lazily started shared worker (one process, default memory limit);
    a run should own a `VerifierPool` instead, sized and limited by its config."""
    calls = list(zip(completions, examples, strict=True))
    return scored_batch(_shared().map(functools.partial(_reward, task), calls, timeout_s=timeout_s))
