"""Reward functions for `task.reward` / `task.rewards`, as a user would write them.

A reward function is `(completion, example) -> float`: `completion` is the decoded text
the model wrote, `example` the task's record (`example.prompt`, `example.answer`, and for
dataset files `example.meta["row"]`, the whole row). It runs in a verifier worker process
under a deadline and a memory limit; if it raises, hangs or crashes, the completion scores 0
and the run goes on (counted in reward/verifier_errors, _timeouts, _crashes).

Used by configs/rlvr/math_jsonl.yaml as `examples.reward_fns:dollar_format` (run from the
repository root: the current directory is on the import path).
"""

from __future__ import annotations

import re

_ONE_MATH_SPAN = re.compile(r"\s*\$[^$]+\$\s*")


def dollar_format(completion: str, example) -> float:
    """1.0 when the answer is one `$...$` math span and nothing else, as the data writes it."""
    return 1.0 if _ONE_MATH_SPAN.fullmatch(completion) else 0.0


def brevity(completion: str, example, limit: int = 16) -> float:
    """1.0 for an empty answer, falling linearly to 0.0 at `limit` characters."""
    return max(0.0, 1.0 - len(completion) / limit)
