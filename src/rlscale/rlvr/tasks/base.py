"""The Task protocol: prompts for a split and seed, and a verifier for one completion."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

SPLITS = ("train", "test")  # the hash split every task has (`split_of`)
OOD = "ood"  # a generated task's out-of-distribution split, disjoint from both by construction
EVAL_SPLITS = (*SPLITS, OOD)


@dataclass(frozen=True)
class ChatMessage:
    role: str       # "system", "user" or "assistant"
    content: str


@dataclass(frozen=True)
class Example:
    """One prompt and what the verifier needs to score a completion of it.

    `prompt` is the text a plain (non-chat) model continues, and the key of the hash split.
    `messages`, when set, is the prompt as a conversation (from a dataset's chat field); the
    model's chat template renders it, with `model.system_prompt` in front when it has none.
    """

    prompt: str
    answer: Any
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    messages: tuple[ChatMessage, ...] | None = None


@runtime_checkable
class Task(Protocol):
    name: str

    def sample(self, split: str, rng: random.Random) -> Example:
        """One example of `split` (train, test, or ood where the task has one), drawn with
        `rng` (deterministic given its state); `check_split` rejects any other split."""

    def verify(self, completion: str, example: Example) -> float:
        """Reward of one completion in [0, 1]; may raise, which the caller scores 0."""

    def demonstration(self, example: Example, rng: random.Random) -> str:
        """A reference completion, for supervised fine-tuning."""


class TaskOptionError(ValueError):
    """A task option of the wrong type or out of range; one line naming the option."""


def check_option(task: str, name: str, value: Any, kind: type, lo: float | None = None,
                 hi: float | None = None, *, lo_open: bool = False) -> None:
    """Raise TaskOptionError unless `value` is a `kind` within [lo, hi] ((lo, hi] if lo_open)."""
    where = f"task '{task}' option {name}"
    ok_type = (isinstance(value, int | float) if kind is float else isinstance(value, kind)) \
        and not isinstance(value, bool)
    if not ok_type:
        raise TaskOptionError(f"{where} must be {'a number' if kind is float else 'an integer'}, "
                              f"got {str(value)[:40]!r}")
    if not math.isfinite(value) or (lo is not None and (value <= lo if lo_open else value < lo)) \
            or (hi is not None and value > hi):
        bounds = (f"{'>' if lo_open else '>='} {lo}" if hi is None
                  else f"in {'(' if lo_open else '['}{lo}, {hi}]")
        raise TaskOptionError(f"{where} must be {bounds}, got {value}")


def check_split(task: str, split: str, *, ood: bool = False) -> None:
    """Raise a one-line TaskOptionError unless `task` has `split` (`ood`: it has an ood split)."""
    if split == OOD and not ood:
        raise TaskOptionError(f"task '{task}' has no '{OOD}' split (it has {', '.join(SPLITS)}; "
                              "arithmetic, countdown and long_arithmetic have one)")
    if split not in EVAL_SPLITS:
        raise TaskOptionError(f"unknown split '{split}' for task '{task}' "
                              f"(known: {', '.join(EVAL_SPLITS)})")


def change_one_digit(text: str, rng: random.Random) -> str | None:
    """`text` with one of its ASCII digits replaced by another digit (a plausible wrong
    answer, for deliberately imperfect demonstrations); None when it has no digit."""
    where = [i for i, c in enumerate(text) if c in "0123456789"]
    if not where:
        return None
    i = rng.choice(where)
    return text[:i] + rng.choice([d for d in "0123456789" if d != text[i]]) + text[i + 1:]


def split_of(prompt: str, test_share: float = 0.1) -> str:
    """Hash-based split: a prompt belongs to exactly one split, whatever the seed."""
    h = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "big")
    return "test" if (h % 10_000) < test_share * 10_000 else "train"


def draw_in_split(generate, split: str, rng: random.Random, test_share: float = 0.1,
                  max_tries: int = 10_000) -> Example:
    """Rejection-sample `generate(rng)` until its prompt falls in `split` (train or test)."""
    if split not in SPLITS:
        raise ValueError(f"'{split}' is not a hash split (known: {', '.join(SPLITS)})")
    if split == "test" and test_share <= 0:
        raise TaskOptionError("the task has no test split (test_share=0); "
                              "set task.options.test_share above 0 to evaluate")
    for _ in range(max_tries):
        example = generate(rng)
        if split_of(example.prompt, test_share) == split:
            return example
    raise TaskOptionError(f"could not draw a '{split}' example in {max_tries} tries "
                          f"(test_share={test_share}; the task may have too few prompts)")


def examples(task: Task, split: str, seed: int, n: int, *, unique: bool = True) -> list[Example]:
    """n examples of `split` for `seed`; distinct prompts when `unique` (held-out eval).

    A finite task (one with `split_examples`, e.g. a data file) gives a seeded sample of its
    rows without repeats, all of them when it has n or fewer.
    """
    rng = random.Random(f"{task.name}:{split}:{seed}")
    if unique and hasattr(task, "split_examples"):
        pool = task.split_examples(split)
        if not pool:
            raise TaskOptionError(f"task '{task.name}' has no '{split}' examples")
        return rng.sample(pool, min(n, len(pool)))
    out: list[Example] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        ex = task.sample(split, rng)
        tries += 1
        if unique and ex.prompt in seen:
            if tries > 50 * n + 1000:
                raise ValueError(f"task '{task.name}' has fewer than {n} distinct {split} prompts")
            continue
        seen.add(ex.prompt)
        out.append(ex)
    return out
