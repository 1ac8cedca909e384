"""Verdicts computed from the numbers: an effect over seeds, its standard error, and whether
it supports, contradicts or leaves open the sign a claim predicts.

Pure functions of floats; no model, no run. An effect is measured once per seed (usually a
paired difference: arm B minus arm A trained with the same seed, or trained minus base on
the same held-out prompts); its estimate is the mean over seeds with the standard error
`sd / sqrt(n)`. One seed has no spread to judge by: its verdict is always inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["supports", "contradicts", "inconclusive"]
VERDICTS: tuple[Verdict, ...] = ("supports", "contradicts", "inconclusive")

# An effect is called when it is at least this many standard errors from zero.
Z = 2.0


@dataclass(frozen=True)
class Estimate:
    """The mean of per-seed values and its standard error (None with fewer than two seeds)."""

    mean: float
    se: float | None
    n: int


def estimate(values: Sequence[float]) -> Estimate:
    if not values:
        raise ValueError("an estimate needs at least one value")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"an estimate needs finite values, got {list(values)}")
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Estimate(mean, None, n)
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return Estimate(mean, math.sqrt(variance / n), n)


def judge(est: Estimate, expected_sign: int, *, min_effect: float = 0.0, z: float = Z) -> Verdict:
    """`supports` when the effect has the expected sign, is at least `z` standard errors
    from zero and at least `min_effect` in size (a difference too small to matter on this
    task is not evidence either way); `contradicts` when the same holds for the opposite
    sign; `inconclusive` otherwise, and always with one seed."""
    if expected_sign not in (-1, 1):
        raise ValueError(f"expected_sign must be +1 or -1, got {expected_sign}")
    if est.se is None or abs(est.mean) < max(z * est.se, min_effect) or est.mean == 0:
        return "inconclusive"
    return "supports" if (est.mean > 0) == (expected_sign > 0) else "contradicts"


def overall(verdicts: Sequence[Verdict]) -> Verdict:
    """One verdict for a claim from the verdicts of its primary effects: contradicted by any,
    supported only by all."""
    if not verdicts:
        raise ValueError("a claim needs at least one primary effect")
    if "contradicts" in verdicts:
        return "contradicts"
    return "supports" if all(v == "supports" for v in verdicts) else "inconclusive"


@dataclass(frozen=True)
class Effect:
    """One measured effect of an experiment: its per-seed values, the sign the claim
    predicts, and the verdict those give. `primary` effects decide the experiment's verdict;
    the others are reported beside it."""

    name: str
    per_seed: tuple[float, ...]
    expected_sign: int
    primary: bool = True
    min_effect: float = 0.0

    @property
    def estimate(self) -> Estimate:
        return estimate(self.per_seed)

    @property
    def verdict(self) -> Verdict:
        return judge(self.estimate, self.expected_sign, min_effect=self.min_effect)

    def as_dict(self) -> dict:
        est = self.estimate
        return {"name": self.name, "per_seed": list(self.per_seed),
                "expected_sign": self.expected_sign, "primary": self.primary,
                "min_effect": self.min_effect, "mean": est.mean, "se": est.se, "n": est.n,
                "verdict": self.verdict}

    @classmethod
    def from_dict(cls, data: dict) -> Effect:
        return cls(data["name"], tuple(data["per_seed"]), data["expected_sign"],
                   data["primary"], data["min_effect"])


def experiment_verdict(effects: Sequence[Effect]) -> Verdict:
    return overall([e.verdict for e in effects if e.primary])


def describe(effect: Effect) -> str:
    """`+0.123 ± 0.045 (2 seeds)`: the estimate as the report and the CLI print it."""
    est = effect.estimate
    spread = "no SE" if est.se is None else f"± {est.se:.3g}"
    return f"{est.mean:+.3g} {spread} ({est.n} seed{'s' if est.n != 1 else ''})"
