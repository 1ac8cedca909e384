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

The training reward is a weighted sum of reward terms (`task.reward` / `task.rewards`):
the task's verifier, the built-in `format` reward, or a user function
`package.module:function` called as `(completion, example) -> float`. All terms of one
completion are one call in the pool, so a term that fails scores the whole completion 0.
Each term's mean is logged as `reward/<name>`. Evaluation (pass@k) always scores with the
task's verifier alone.
"""

from __future__ import annotations

import functools
import math
import pickle
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..runtime.dotted import import_callable
from ..runtime.workpool import DEFAULT_MEMORY_MB, Crash, Error, Ok, Outcome, Timeout, WorkPool
from .tasks import Example, Task

if TYPE_CHECKING:
    from .config import TaskConfig

RewardFunction = Callable[[str, Example], float]
# reward/<name> metrics the loop logs itself; a term may not take these names.
RESERVED_NAMES = frozenset({"mean", "std", "shaped_mean", "zero_advantage_group_share",
                            "verifier_errors", "verifier_timeouts", "verifier_crashes",
                            "first_error"})


def format_reward(completion: str, example: Example, *, tag: str = "answer") -> float:
    """1.0 when the completion is one `<tag>...</tag>` and nothing else (whitespace aside)."""
    pattern = rf"\s*<{tag}>(?:(?!<{tag}>|</{tag}>).)*</{tag}>\s*"
    return 1.0 if re.fullmatch(pattern, completion, flags=re.DOTALL) else 0.0


@dataclass(frozen=True)
class RewardTerm:
    """One weighted term of the training reward; `fn` None is the task's own verifier."""

    name: str
    weight: float = 1.0
    fn: RewardFunction | None = None


VERIFIER = (RewardTerm("verifier"),)


def reward_terms(task: Task, config: TaskConfig) -> tuple[RewardTerm, ...]:
    """The configured terms, resolved: user functions imported now (one-line errors)."""
    if config.reward is not None:
        specs = [(config.reward, 1.0, None)]
    elif config.rewards:
        specs = [(t.fn, t.weight, t.name) for t in config.rewards]
    else:
        return VERIFIER
    terms = []
    for fn, weight, name in specs:
        if fn == "verifier":
            term = RewardTerm(name or "verifier", weight)
        elif fn == "format":
            tag = getattr(task, "answer_tag", None) or "answer"
            term = RewardTerm(name or "format", weight, functools.partial(format_reward, tag=tag))
        else:
            function = import_callable(fn, what="reward function")
            term = RewardTerm(name or fn.rpartition(":")[2].rpartition(".")[2], weight, function)
        if term.name in RESERVED_NAMES or not re.fullmatch(r"[A-Za-z0-9_.-]+", term.name):
            raise ValueError(f"reward name '{term.name}' is reserved or not a plain name; "
                             "give the term another name")
        terms.append(term)
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        raise ValueError(f"reward names must differ, got {names}; set name: for each term")
    return tuple(terms)




@dataclass
class ScoredBatch:
    rewards: list[float]            # the weighted sum of the terms, per completion
    errors: int = 0
    timeouts: int = 0
    crashes: int = 0
    first_error: str | None = None  # one line, the first problem in batch order
    terms: dict[str, list[float]] = field(default_factory=dict)  # each term, unweighted


def _term_rewards(task: Task, terms: Sequence[RewardTerm], completion: str,
                  example: Example) -> tuple[float, ...]:
    """Runs in the worker: float() there, so only plain floats have to travel back."""
    out = []
    for term in terms:
        fn = task.verify if term.fn is None else term.fn
        reward = float(fn(completion, example))
        if not math.isfinite(reward):  # one NaN reward would turn the whole update to NaN
            raise ValueError(f"non-finite reward {reward} from '{term.name}'")
        out.append(reward)
    return tuple(out)


def scored_batch(outcomes: Sequence[Outcome], terms: Sequence[RewardTerm] = VERIFIER) -> ScoredBatch:
    """Rewards from worker-pool outcomes: anything but `Ok` scores 0 and is counted."""
    out = ScoredBatch(rewards=[], terms={t.name: [] for t in terms})
    for outcome in outcomes:
        problem = None
        match outcome:
            case Ok(values):
                out.rewards.append(sum(t.weight * v for t, v in zip(terms, values, strict=True)))
                for t, v in zip(terms, values, strict=True):
                    out.terms[t.name].append(v)
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
        for name in out.terms:
            out.terms[name].append(0.0)
        out.first_error = out.first_error or problem
    return out


class VerifierPool:
    """The reward `terms` (default: `task.verify`) in `workers` persistent processes;
    `score` is thread-safe.

    Create one per run and close it at the end (or use `with`); workers are stopped at
    interpreter exit in any case. Each worker uses one core while it scores, and none
    while idle.
    """

    def __init__(self, task: Task, *, terms: Sequence[RewardTerm] = VERIFIER, workers: int = 1,
                 timeout_s: float = 2.0, memory_mb: int | None = DEFAULT_MEMORY_MB):
        try:
            pickle.dumps(task)
        except Exception as exc:
            raise TypeError(f"task '{getattr(task, 'name', task)}' must be picklable to run in "
                            f"verifier workers (defined at module level): {exc}") from None
        for term in terms:
            try:
                pickle.dumps(term)
            except Exception as exc:
                raise TypeError(f"reward '{term.name}' must be picklable to run in verifier "
                                f"workers (a module-level function): {exc}") from None
        self.task = task
        self.terms = tuple(terms)
        self.timeout_s = timeout_s
        self._verify = functools.partial(_term_rewards, task, self.terms)
        self._pool = WorkPool(workers, timeout_s=timeout_s, memory_mb=memory_mb)

    @classmethod
    def from_config(cls, task: Task, config: TaskConfig) -> VerifierPool:
        return cls(task, terms=reward_terms(task, config), workers=config.verifier_workers,
                   timeout_s=config.verifier_timeout_s, memory_mb=config.verifier_memory_mb)

    @property
    def pids(self) -> list[int]:
        return self._pool.pids

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> ScoredBatch:
        calls = list(zip(completions, examples, strict=True))
        return scored_batch(self._pool.map(self._verify, calls), self.terms)

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
    return scored_batch(_shared().map(functools.partial(_term_rewards, task, VERIFIER), calls,
                                      timeout_s=timeout_s))
