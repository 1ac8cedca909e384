"""Elo ratings: one player's Elo over another from their results (`elo_difference`), and
the Elo of many players from all their matches jointly (`fit_ratings`).

One pairing. Logistic model: a score s is worth 400 log10(s / (1 - s)) Elo. The 95% interval
is the Wilson score interval of s over the n games, mapped through the same curve. Counting a
draw as half a win in a binomial model overstates the variance when there are draws, so the
interval is slightly conservative. A 0% or 100% score has no finite Elo: the estimate is
-inf/+inf and the interval's finite end is the bound to report ("> +431").

Many players (`fit_ratings`). Bradley-Terry by maximum likelihood over all the matches jointly:
P(i beats j) = 1 / (1 + 10^((R_j - R_i) / 400)), a draw counted as half a win and half a
loss, the first anchor (`random` by default) fixed at 0. A pairing one side won every game
of has no finite maximum, so every pairing also counts `prior_draws` virtual draws (1 by
default; the prior BayesElo uses): a 100% score gives a large but finite gap with a wide
interval. Intervals: rating +- z * standard error, the standard errors from the inverse of
the Fisher information (the Hessian of the log-likelihood at the fit) with the anchor fixed:
each interval is relative to the anchor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

_ELO = 400.0 / math.log(10.0)  # Elo per natural-log unit of odds


class PairingResult(Protocol):
    """What a fit reads of one pairing's games (a `MatchResult` of zero/matches.py is one)."""

    agent_a: str
    agent_b: str
    wins: int  # agent A's view
    draws: int
    losses: int


@dataclass(frozen=True)
class EloEstimate:
    elo: float  # +-inf at a 100% / 0% score
    low: float  # 95% interval (or the requested confidence); -inf / +inf where unbounded
    high: float
    score: float
    games: int

    def __str__(self) -> str:
        if self.games == 0:
            return "n/a (no games)"
        if math.isinf(self.elo):
            bound = self.low if self.elo > 0 else self.high
            return f"{'>' if self.elo > 0 else '<'} {bound:+.0f} (95% bound)"
        return f"{self.elo:+.0f} [{self.low:+.0f}, {self.high:+.0f}]"

    def as_dict(self) -> dict[str, Any]:
        def clean(x: float) -> float | None:
            return None if math.isinf(x) or math.isnan(x) else round(x, 1)

        return {"elo": clean(self.elo), "low": clean(self.low), "high": clean(self.high),
                "score": self.score, "games": self.games, "text": str(self)}


def score_to_elo(score: float) -> float:
    """Logistic model: the Elo difference at which the expected score is `score`."""
    if score <= 0.0:
        return -math.inf
    if score >= 1.0:
        return math.inf
    return 400.0 * math.log10(score / (1.0 - score))


def normal_quantile(confidence: float) -> float:
    # Two-sided z for `confidence` by bisection on erf (no scipy needed).
    target, lo, hi = (1.0 + confidence) / 2.0, 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2.0))) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def wilson_interval(score: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion observed as `score` over `n` trials."""
    if n <= 0:
        return 0.0, 1.0
    z = normal_quantile(confidence)
    denom = 1.0 + z * z / n
    centre = (score + z * z / (2 * n)) / denom
    half = z * math.sqrt(score * (1.0 - score) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def elo_difference(wins: int, draws: int, losses: int, confidence: float = 0.95) -> EloEstimate:
    """Elo of the player with these results over its opponent, with a `confidence` interval."""
    n = wins + draws + losses
    if n == 0:
        return EloEstimate(0.0, -math.inf, math.inf, 0.5, 0)
    score = (wins + 0.5 * draws) / n
    low, high = wilson_interval(score, n, confidence)
    return EloEstimate(score_to_elo(score), score_to_elo(low), score_to_elo(high), score, n)


@dataclass(frozen=True)
class Rating:
    name: str
    elo: float
    low: float  # the interval at the fit's confidence (0.95 by default)
    high: float
    games: int  # real games played (virtual draws not counted)


def fit_ratings(
    results: Sequence[PairingResult],
    anchor: str,
    confidence: float = 0.95,
    prior_draws: float = 1.0,
) -> dict[str, Rating]:
    """Bradley-Terry Elo of every player in `results` (by their agent names), `anchor` at 0,
    by Newton's method on the log-likelihood (see the module docstring)."""
    names = sorted({r.agent_a for r in results} | {r.agent_b for r in results})
    if anchor not in names:
        raise ValueError(f"the anchor {anchor!r} plays in none of the matches")
    index = {name: i for i, name in enumerate(names)}
    k = len(names)
    n = np.zeros((k, k))  # games between i and j, virtual draws included
    w = np.zeros((k, k))  # i's score against j (wins + draws / 2)
    played = np.zeros(k, np.int64)
    for r in results:
        i, j = index[r.agent_a], index[r.agent_b]
        if i == j:
            raise ValueError(f"{r.agent_a!r} is paired with itself")
        games = r.wins + r.draws + r.losses
        score = r.wins + 0.5 * r.draws + 0.5 * prior_draws
        n[i, j] += games + prior_draws
        n[j, i] += games + prior_draws
        w[i, j] += score
        w[j, i] += games + prior_draws - score
        played[[i, j]] += games
    apart = sorted(set(names) - _connected(n > 0, index[anchor], names))
    if apart:
        raise ValueError(f"no chain of matches links {apart[0]!r} to the anchor {anchor!r}")
    free = np.array([i for i in range(k) if names[i] != anchor], np.int64)
    x = np.zeros(k)  # ratings in natural-log odds units
    for _ in range(500):
        p = 1.0 / (1.0 + np.exp(x[None, :] - x[:, None]))  # p[i, j] = P(i beats j)
        grad = (w - n * p).sum(1)[free]
        info = n * p * (1.0 - p)
        hessian = (np.diag(info.sum(1)) - info)[np.ix_(free, free)]  # minus the Hessian
        step = np.linalg.solve(hessian, grad)
        x[free] += np.clip(step, -2.0, 2.0)  # damped: at most ~350 Elo a step
        if np.abs(step).max() < 1e-9:
            break
    se = np.zeros(k)
    se[free] = np.sqrt(np.diag(np.linalg.inv(hessian)))
    z = normal_quantile(confidence)
    return {
        name: Rating(name, float(_ELO * x[i]), float(_ELO * (x[i] - z * se[i])),
                     float(_ELO * (x[i] + z * se[i])), int(played[i]))
        for name, i in index.items()
    }


def _connected(linked: np.ndarray, start: int, names: list[str]) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        i = todo.pop()
        for j in np.flatnonzero(linked[i]):
            if int(j) not in seen:
                seen.add(int(j))
                todo.append(int(j))
    return {names[i] for i in seen}
