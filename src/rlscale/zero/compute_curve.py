"""The test-time compute curve: the same network with 0, 1, 2, 4, ... simulations against its
own raw policy (`compute_curve`), every match from the same openings; its table, JSON,
metrics and plot (`write_compute_curve`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .agents import NetworkAgent
from .games.base import Game
from .matches import DEFAULT_OPENING_PLIES, MatchResult, play_match
from .ratings import wilson_interval

CURVE_SIMULATIONS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 800)


@dataclass
class CurvePoint:
    simulations: int
    result: MatchResult

    def row(self) -> dict[str, Any]:
        r = self.result
        return {"simulations": self.simulations, "wins": r.wins, "draws": r.draws,
                "losses": r.losses, "score": r.score, "elo": r.elo().as_dict(),
                "seconds": round(r.seconds, 2)}


def curve_simulations(max_simulations: int) -> list[int]:
    """0, 1, 2, 4, ... up to `max_simulations` (included)."""
    sims, step = [0], 1
    while step < max_simulations:
        sims.append(step)
        step *= 2
    return sims + [max_simulations] if max_simulations > 0 else sims


def compute_curve(
    game: Game,
    agent: NetworkAgent,
    simulations: Sequence[int],
    games: int,
    seed: int = 0,
    opening_plies: int = DEFAULT_OPENING_PLIES,
    on_point: Callable[[CurvePoint], None] | None = None,
) -> list[CurvePoint]:
    """The network with each budget in `simulations` against its own raw policy, every match
    from the same openings."""
    raw = agent.with_simulations(0, "raw policy")
    points = []
    for sims in simulations:
        result = play_match(game, agent.with_simulations(sims), raw, games, seed, opening_plies)
        point = CurvePoint(sims, result)
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points


def curve_table(points: list[CurvePoint]) -> str:
    lines = ["| simulations | W | D | L | score | Elo vs raw policy (95% CI) | seconds |",
             "| ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for p in points:
        r = p.result
        lines.append(f"| {p.simulations} | {r.wins} | {r.draws} | {r.losses} | "
                     f"{100 * r.score:.1f}% | {r.elo()} | {r.seconds:.0f} |")
    return "\n".join(lines)


def write_compute_curve(points: list[CurvePoint], out: str | Path, title: str = "") -> Path:
    """`curve.md` (table), `curve.json`, `metrics.jsonl` (step = simulations) and `curve.png`
    into the folder `out`; returns the PNG's path."""
    from ..runtime.metrics import MetricsLogger

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.md").write_text(curve_table(points) + "\n")
    (out / "curve.json").write_text(json.dumps([p.row() for p in points], indent=2) + "\n")
    logger = MetricsLogger(out, tensorboard=False)
    for p in points:
        e = p.result.elo()
        logger.log(p.simulations, {"score": p.result.score, "elo": e.elo, "elo_low": e.low,
                                   "elo_high": e.high, "games": p.result.games})
    logger.close()
    return plot_compute_curve(points, out / "curve.png", title)


def plot_compute_curve(points: list[CurvePoint], out: str | Path, title: str = "") -> Path:
    """Two panels against simulations (log2 axis, 0 drawn at 1/2), with 95% intervals: Elo
    over the raw policy (a 100% / 0% score drawn at the finite end of its interval, open
    marker) and the score itself."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..runtime.figures import save_figure

    def x_of(sims: int) -> float:
        return float(sims) if sims > 0 else 0.5

    xs, ys, lo, hi, open_x, open_y = [], [], [], [], [], []
    for p in points:
        e = p.result.elo()
        if math.isinf(e.elo):
            open_x.append(x_of(p.simulations))
            open_y.append(e.low if e.elo > 0 else e.high)
            continue
        xs.append(x_of(p.simulations))
        ys.append(e.elo)
        lo.append(e.elo - e.low if math.isfinite(e.low) else 0.0)
        hi.append(e.high - e.elo if math.isfinite(e.high) else 0.0)
    fig, (ax, ax_score) = plt.subplots(1, 2, figsize=(11, 4))
    ticks = [p.simulations for p in points]
    scores = [100 * p.result.score for p in points]
    bounds = [wilson_interval(p.result.score, p.result.games) for p in points]
    ax_score.errorbar([x_of(t) for t in ticks], scores, marker="o", capsize=3, color="C1",
                      # max(0, .): at a 0% or 100% score the Wilson bound equals the score
                      # up to rounding, and matplotlib refuses a negative error bar.
                      yerr=[[max(0.0, s - 100 * b[0]) for s, b in zip(scores, bounds, strict=True)],
                            [max(0.0, 100 * b[1] - s) for s, b in zip(scores, bounds, strict=True)]])
    ax_score.axhline(50.0, color="grey", lw=0.8)
    ax_score.set_ylim(0, 100)
    ax_score.set_ylabel("score vs raw policy, % (95% CI)")
    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label="Elo vs raw policy (95% CI)")
    if open_x:
        ax.plot(open_x, open_y, "^", mfc="none", color="C0", label="score 100%: lower bound")
    ax.axhline(0.0, color="grey", lw=0.8)
    for axis in (ax, ax_score):
        axis.set_xscale("log", base=2)
        axis.set_xticks([x_of(t) for t in ticks], [str(t) for t in ticks], fontsize=8)
        axis.minorticks_off()
        axis.set_xlabel("simulations per move")
        axis.grid(alpha=0.3)
    ax.set_ylabel("Elo over the raw policy")
    ax.legend(fontsize=8)
    fig.suptitle(title or "test-time compute")
    return save_figure(fig, out)
