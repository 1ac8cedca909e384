"""Small helpers that turn per-seed measurements into rows, curves and paired differences."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .verdict import estimate


def mean(values: Sequence[float]) -> float:
    return estimate(list(values)).mean


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, ...]:
    """Per-seed differences `b - a` (the same seeds, in the same order)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need the same seeds, got {len(a)} and {len(b)}")
    return tuple(y - x for x, y in zip(a, b, strict=True))


def curve(per_seed: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """The mean curve over seeds and its standard error at each point (0 with one seed)."""
    points = list(zip(*per_seed, strict=True))
    estimates = [estimate(list(p)) for p in points]
    return [e.mean for e in estimates], [e.se or 0.0 for e in estimates]


def cell(values: Sequence[float], digits: int = 3) -> str:
    """`0.512 ± 0.013`: a table cell of per-seed values (the mean alone with one seed)."""
    est = estimate(list(values))
    if est.se is None:
        return f"{est.mean:.{digits}f}"
    return f"{est.mean:.{digits}f} ± {est.se:.{digits}f}"


def by_seed(per_seed: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Figures measured once per seed (one dict each, the same keys) as one list per figure,
    in seed order: the shape every experiment saves its per-seed numbers in."""
    return {key: [figures[key] for figures in per_seed] for key in per_seed[0]}
