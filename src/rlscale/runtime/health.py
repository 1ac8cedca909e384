"""The non-finite guard shared by both loops.

A step whose loss, gradient norm or KL is not finite is skipped (the loop restores the
weights it had before), counted as `health/skipped_steps` and warned about once; N such
steps in a row stop the run with a one-line error, after a checkpoint of the last good
state, so a diverged run is never silently trained on NaNs and never loses its good steps.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any


class NonFiniteError(RuntimeError):
    """Too many non-finite steps in a row: the run stopped (one-line message)."""


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
    import torch

    return all(bool(torch.isfinite(p).all()) for p in parameters)


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
