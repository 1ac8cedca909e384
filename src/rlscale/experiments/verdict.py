"""Verdicts computed from the numbers: an effect over seeds, its confidence interval, and
whether it supports, contradicts or leaves open the sign a claim predicts.

Pure functions of floats; no model, no run. An effect is measured once per seed (usually a
paired difference: arm B minus arm A trained with the same seed, or trained minus base on
the same held-out prompts); its estimate is the mean over the n seeds with the standard
error `sd / sqrt(n)`, and `(mean - effect) / SE` follows Student's t with n - 1 degrees of
freedom (normal per-seed values). The rule:

- **called** when the two-sided `1 - ALPHA` interval `mean ± t_{n-1} SE` excludes 0 *and*
  |mean| >= the effect's `min_effect` (the smallest effect that matters on the task, chosen
  before the run); then `supports` for the predicted sign, `contradicts` for the other;
- `inconclusive` otherwise, and always with one seed (no spread to judge by).

Under the null (true effect 0) the interval excludes 0 with probability ALPHA, and
`min_effect` only removes calls: a false call, either way, has probability <= ALPHA = 5%
per effect (checked by simulation in the tests). With 2 seeds `t_1 = 12.7`, not the 2 that
a normal approximation gives: two seeds almost never decide anything.

**At most** (`Effect.test = "at_most"`, a non-superiority test): a claim that an effect is
not above a margin (e.g. "RL does not raise pass@k at large k") is supported when the
one-sided `1 - ALPHA` upper bound `mean + t_{1-ALPHA, n-1} SE` is below the effect's
`min_effect` (the margin), contradicted when the two-sided interval excludes 0 from above
and the mean is at least the margin; under a true effect at the margin a false support has
probability <= ALPHA.

**Power.** `detectable` is the smallest true effect whose interval would exclude 0 with
probability POWER (80%) at the observed spread: `(t_{1 - ALPHA/2, n-1} + t_{POWER, n-1}) SE`.
A set-up `could_show` an effect when that is no larger than the effect's `min_effect` (an
effect that matters would be found 4 times in 5); an inconclusive verdict from a set-up that
could not is no evidence of absence, and the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scipy.stats import t as student_t

Verdict = Literal["supports", "contradicts", "inconclusive"]
VERDICTS: tuple[Verdict, ...] = ("supports", "contradicts", "inconclusive")

ALPHA = 0.05   # two-sided false-call rate per effect
POWER = 0.80   # the probability `detectable` is defined at


def t_quantile(probability: float, df: int) -> float:
    """Student's t quantile with `df` degrees of freedom."""
    return float(student_t.ppf(probability, df))


@dataclass(frozen=True)
class Estimate:
    """The mean of per-seed values and its standard error (None with fewer than two seeds)."""

    mean: float
    se: float | None
    n: int

    def half_width(self, alpha: float = ALPHA) -> float | None:
        """Half the two-sided `1 - alpha` interval, `t_{1-alpha/2, n-1} SE`."""
        return None if self.se is None else t_quantile(1 - alpha / 2, self.n - 1) * self.se

    def interval(self, alpha: float = ALPHA) -> tuple[float, float] | None:
        half = self.half_width(alpha)
        return None if half is None else (self.mean - half, self.mean + half)

    def detectable(self, alpha: float = ALPHA, power: float = POWER) -> float | None:
        """The smallest true effect whose interval excludes 0 with probability `power`, at
        this spread and number of seeds (None with one seed: nothing is detectable)."""
        if self.se is None:
            return None
        df = self.n - 1
        return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * self.se


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


def judge_at_most(est: Estimate, margin: float, *, alpha: float = ALPHA) -> Verdict:
    """The non-superiority verdict: `supports` when the one-sided `1 - alpha` upper bound is
    below `margin`, `contradicts` when the effect is clearly positive and at least `margin`,
    `inconclusive` otherwise (and always with one seed)."""
    if margin <= 0:
        raise ValueError(f"an at-most test needs a positive margin, got {margin}")
    if est.se is None:
        return "inconclusive"
    if est.mean + t_quantile(1 - alpha, est.n - 1) * est.se < margin:
        return "supports"
    half = est.half_width(alpha)
    return "contradicts" if est.mean - half > 0 and est.mean >= margin else "inconclusive"


def judge(est: Estimate, expected_sign: int, *, min_effect: float = 0.0,
          alpha: float = ALPHA) -> Verdict:
    """`supports` when the `1 - alpha` interval excludes 0 on the expected side and the
    effect is at least `min_effect` in size (a difference too small to matter on this task
    is not evidence either way); `contradicts` when the same holds for the opposite sign;
    `inconclusive` otherwise, and always with one seed."""
    if expected_sign not in (-1, 1):
        raise ValueError(f"expected_sign must be +1 or -1, got {expected_sign}")
    half = est.half_width(alpha)
    if half is None or est.mean == 0 or abs(est.mean) <= half or abs(est.mean) < min_effect:
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
    predicts, the smallest size that matters (`min_effect`, chosen before the run; every
    primary effect states one), and the verdict those give. `primary` effects decide the
    experiment's verdict; the others are reported beside it."""

    name: str
    per_seed: tuple[float, ...]
    expected_sign: int
    primary: bool = True
    min_effect: float = 0.0
    test: Literal["sign", "at_most"] = "sign"  # at_most: min_effect is the margin

    @property
    def estimate(self) -> Estimate:
        return estimate(self.per_seed)

    @property
    def verdict(self) -> Verdict:
        if self.test == "at_most":
            return judge_at_most(self.estimate, self.min_effect)
        return judge(self.estimate, self.expected_sign, min_effect=self.min_effect)

    @property
    def could_show(self) -> bool:
        """Whether the design finds an effect of `min_effect` 4 times in 5 (POWER) at the
        observed spread (at most: shows a zero effect below the margin 4 times in 5);
        never with one seed or without a stated minimum."""
        est = self.estimate
        if self.test == "at_most":
            if est.se is None:
                return False
            df = est.n - 1
            reach = (t_quantile(1 - ALPHA, df) + t_quantile(POWER, df)) * est.se
            return 0 < reach <= self.min_effect
        detectable = est.detectable()
        return detectable is not None and 0 < detectable <= self.min_effect

    def as_dict(self) -> dict:
        est = self.estimate
        return {"name": self.name, "per_seed": list(self.per_seed),
                "expected_sign": self.expected_sign, "primary": self.primary,
                "min_effect": self.min_effect, "mean": est.mean, "se": est.se, "n": est.n,
                "interval": est.interval(), "alpha": ALPHA, "detectable": est.detectable(),
                "power": POWER, "could_show": self.could_show, "test": self.test,
                "verdict": self.verdict}

    @classmethod
    def from_dict(cls, data: dict) -> Effect:
        return cls(data["name"], tuple(data["per_seed"]), data["expected_sign"],
                   data["primary"], data["min_effect"], data.get("test", "sign"))


def experiment_verdict(effects: Sequence[Effect]) -> Verdict:
    return overall([e.verdict for e in effects if e.primary])


def could_show(effects: Sequence[Effect]) -> bool:
    """Whether every primary effect's design could find an effect of its `min_effect`."""
    return all(e.could_show for e in effects if e.primary)


def describe(effect: Effect) -> str:
    """`+0.123 [+0.02, +0.22] (4 seeds)`: the estimate with its 95% interval, as the report
    and the CLI print it."""
    est = effect.estimate
    interval = est.interval()
    spread = ("no interval" if interval is None
              else f"[{interval[0]:+.3g}, {interval[1]:+.3g}]")
    return f"{est.mean:+.3g} {spread} ({est.n} seed{'s' if est.n != 1 else ''})"


def power_statement(effect: Effect) -> str:
    """`detects >= 0.041 (80%); min 0.02: cannot show`: the power line of one effect."""
    detectable = effect.estimate.detectable()
    if detectable is None:
        return "one seed: detects nothing"
    if detectable == 0:
        return (f"every seed gave the same value: no spread to size the power by; min "
                f"{effect.min_effect:g}: cannot show")
    verdict = "could show" if effect.could_show else "cannot show"
    return (f"detects >= {detectable:.3g} ({POWER:.0%}); min {effect.min_effect:g}: "
            f"{verdict}")
