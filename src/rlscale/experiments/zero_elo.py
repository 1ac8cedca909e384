"""Zero: self-play improves the player. AlphaZero's curves (Silver et al. 2017, 2018) are Elo
against training time: every checkpoint rated by games against the others and fixed
opponents. Here a short AlphaZero run on Connect Four (configs/zero/connect4.yaml) saves a
checkpoint every iteration; `zero.elo_curve` then rates all of them, each with a small search
of its own, against their next checkpoints and fixed anchors (a uniformly random player,
pure Monte Carlo tree search with random playouts), by a joint Bradley-Terry fit with the
random player at 0 Elo.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..zero.agents import load_network_agent, make_agent
from ..zero.elo_curve import elo_curve, find_checkpoints
from .parallel import judge_at_once
from .plots import plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Context, TrainedZeroArm, ZeroArm
from .spec import QUICK_SELFPLAY, Experiment, Numbers, ZeroBudget
from .stats import cell, mean
from .verdict import Effect
from .zero_compute import QUICK_NETWORK

NAME = "zero_elo"
CLAIM = ("Zero: self-play training makes the player stronger as it goes: every checkpoint of "
         "an AlphaZero run rated in one Elo fit, the last is rated above the first and Elo "
         "rises with the iteration (Connect Four).")
CONFIG = "connect4.yaml"


@dataclass(frozen=True)
class Settings(ZeroBudget):
    simulations: int             # each checkpoint's search per move when rated
    games: int                   # games per pairing
    anchors: tuple[str, ...]     # fixed players (arena specs); the first is rated 0
    neighbours: int              # later checkpoints each checkpoint plays


def checkpoint_overrides(iterations: int) -> tuple[str, ...]:
    """Every iteration leaves a checkpoint, and all of them are kept."""
    return (f"train.iterations={iterations}", "checkpoint.every=1", f"checkpoint.keep={iterations}")


SETUP = ("AlphaZero on Connect Four (configs/zero/connect4.yaml) for 6 iterations of 256 "
         "games, a checkpoint each; all six, searching 32 simulations a move, rated with "
         "random play and pure MCTS (100 and 400 random playouts a move) in one "
         "Bradley-Terry Elo fit per seed, 40 games per pairing.")
SETTINGS = {
    "quick": Settings(iterations=2, simulations=4, games=4, anchors=("random", "mcts:8"),
                      neighbours=1, overrides=(*QUICK_NETWORK, *QUICK_SELFPLAY)),
    # ~1,500 games of the recipe, from a random network: the steep start of its curve.
    "full": Settings(iterations=6, simulations=32, games=40, anchors=("random", "mcts:100", "mcts:400"),
                     neighbours=2, overrides=("train.min_replay=2048",)),
}


def arms(scale: str) -> list[ZeroArm]:
    s = SETTINGS[scale]
    return [ZeroArm("alphazero", CONFIG, (*checkpoint_overrides(s.iterations), *s.overrides))]


def rate_run(run: TrainedZeroArm, s: Settings) -> dict:
    """Every checkpoint of `run` and the anchors, rated in one fit (zero.elo_curve)."""
    checkpoints = find_checkpoints(run.run_dir)
    anchors = {spec: make_agent(spec, "connect4", None, s.simulations, "trained",
                                run.seed + 1000 + i) for i, spec in enumerate(s.anchors)}
    curve = elo_curve(checkpoints, lambda c: load_network_agent(
        c.path, s.simulations, game="connect4", seed=run.seed, name=c.name), anchors, s.games,
        seed=run.seed, neighbours=s.neighbours, run_dir=run.run_dir)
    ratings = [curve.ratings[c.name] for c in checkpoints]
    return {"iterations": [c.iteration for c in checkpoints],
            "selfplay_games": [c.selfplay_games or 0 for c in checkpoints],
            "elo": [r.elo for r in ratings], "low": [r.low for r in ratings],
            "high": [r.high for r in ratings],
            "anchors": {name: [curve.ratings[name].elo, curve.ratings[name].low,
                               curve.ratings[name].high] for name in s.anchors},
            "matches": len(curve.results)}


def measure(ctx: Context, trained: dict[str, list[TrainedZeroArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    return {"seeds": list(ctx.seeds), "simulations": s.simulations, "games": s.games,
            "anchors": list(s.anchors), "neighbours": s.neighbours,
            "runs": judge_at_once(ctx, partial(rate_run, s=s), trained["alphazero"])}


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (0 where either side has no spread)."""
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx > 0 and sy > 0 else 0.0


def analyse(numbers: Numbers) -> Analysis:
    runs = numbers["runs"]
    effects = [
        Effect("Elo: final checkpoint - first checkpoint",
               tuple(r["elo"][-1] - r["elo"][0] for r in runs), expected_sign=+1,
               min_effect=50.0),
        Effect("Spearman rank correlation of Elo with the iteration",
               tuple(spearman(r["iterations"], r["elo"]) for r in runs), expected_sign=+1,
               min_effect=0.2, primary=False),
    ]
    rows = []
    for k, iteration in enumerate(runs[0]["iterations"]):
        rows.append([f"iteration {iteration}", cell([r["selfplay_games"][k] for r in runs], 0),
                     cell([r["elo"][k] for r in runs], 0),
                     f"± {mean([(r['high'][k] - r['low'][k]) / 2 for r in runs]):.0f}"])
    for name in numbers["anchors"]:
        values = [r["anchors"][name] for r in runs]
        rows.append([f"anchor {name}", "-", cell([v[0] for v in values], 0),
                     "fixed" if name == numbers["anchors"][0]
                     else f"± {mean([(v[2] - v[1]) / 2 for v in values]):.0f}"])
    table = Table(["player", "self-play games", "Elo (mean ± SE over seeds)",
                   "95% interval of the fit (mean half-width)"], rows)
    notes = [f"Each seed's checkpoints, each searching {numbers['simulations']} simulations a "
             f"move, and the anchors ({', '.join(numbers['anchors'])}; mcts:N is pure MCTS with "
             f"N random playouts a move) rated in one Bradley-Terry fit, {numbers['anchors'][0]} "
             f"at 0: {numbers['games']} games per pairing (pairs from a random 2-ply opening, "
             f"colours swapped), each checkpoint against every anchor and its next "
             f"{numbers['neighbours']} checkpoints, {runs[0]['matches']} pairings a seed. "
             "Every pairing adds one virtual draw, so a pairing one side won every game of "
             "gives a finite gap with a wide interval."]
    gains = [r["elo"][-1] - r["elo"][0] for r in runs]
    halves = [r["elo"][len(r["elo"]) // 2] - r["elo"][0] for r in runs]
    if len(runs[0]["elo"]) > 2 and mean(gains) > 0:
        notes.append(f"Of the {mean(gains):+.0f} Elo from the first checkpoint to the last, "
                     f"{mean(halves):+.0f} came by iteration "
                     f"{runs[0]['iterations'][len(runs[0]['elo']) // 2]}.")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (seed, run) in enumerate(zip(numbers["seeds"], numbers["runs"], strict=True)):
        ax.errorbar(run["selfplay_games"], run["elo"], capsize=3, marker="o", color=f"C{i}",
                    yerr=[[e - lo for e, lo in zip(run["elo"], run["low"], strict=True)],
                          [hi - e for e, hi in zip(run["elo"], run["high"], strict=True)]],
                    label=f"seed {seed} (95% CI)")
    for j, name in enumerate(numbers["anchors"]):
        level = mean([r["anchors"][name][0] for r in numbers["runs"]])
        ax.axhline(level, color="grey", ls=("--", ":", "-.")[j % 3], lw=1,
                   label=f"{name} (mean over seeds)")
    ax.set_xlabel("self-play games")
    ax.set_ylabel(f"Elo ({numbers['anchors'][0]} = 0)")
    ax.set_title(f"Elo during training: checkpoints with {numbers['simulations']} simulations "
                 "(Connect Four)")
    tidy(ax)
    return save_figure(fig, out)


# minutes: measured 13.6 min (2 seeds, 2 cores, 2026-12-03)
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=7, needs_base=False)
