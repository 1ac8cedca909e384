"""Zero: search is a compute dial at test time. The same trained network, with no change to
its weights, plays with 0 simulations (its raw policy: the most probable legal move) and
with 1, 2, 4, ... simulations of its own search; AlphaZero (Silver et al. 2018, fig. 2) and
MuZero report the strength rising with the budget and flattening as it grows.

Connect Four has a perfect solver (zero/solver.py) and a benchmark of positions with exact
values (shared/data/connect4): AlphaZero trains configs/zero/connect4.yaml for a few
iterations; its final network then plays every benchmark position at each budget, and each
move is judged by the solver (zero.perfect_play.solver_agreement: the move keeps the
position's win/draw/loss value). The same network also plays matches against its own raw
policy at each budget (zero.compute_curve).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..zero.agents import Agent, load_network_agent
from ..zero.compute_curve import compute_curve
from ..zero.games.connect4 import Connect4
from ..zero.perfect_play import AGREEMENT_FILES, solver_agreement
from .parallel import judge_at_once
from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Context, TrainedZeroArm, ZeroArm
from .spec import QUICK_SELFPLAY, Experiment, Numbers, ZeroBudget, zero_arms
from .stats import cell, mean, paired
from .verdict import Effect

NAME = "zero_compute"
CLAIM = ("Zero: searching more at test time makes the same trained network play better, with "
         "diminishing returns: its moves keep a perfect solver's value more often as its "
         "simulations double, and a late doubling gains less than an early one (Connect Four).")
CONFIG = "connect4.yaml"


@dataclass(frozen=True)
class Settings(ZeroBudget):
    simulations: tuple[int, ...]  # 0 (the raw policy), then doublings
    early: int                   # the first doubling compared: early -> 2 x early
    positions: int               # benchmark positions per agreement file
    games: int                   # games against the raw policy at each budget


SETUP = ("AlphaZero on Connect Four (configs/zero/connect4.yaml, Gumbel search with 32 "
         "simulations) for 4 iterations of 256 games; its final network plays 1,500 solver "
         "benchmark positions (500 from each of three files; each move judged by the perfect "
         "solver) and 64 games against its own raw policy, with 0-256 simulations of its "
         "search. Diminishing returns: the mean gain of the doublings 8 -> 16 -> 32 against "
         "that of 64 -> 128 -> 256, fixed before the run.")
QUICK_NETWORK = ("network.blocks=1", "network.channels=16", "network.value_hidden=16")
SETTINGS = {
    "quick": Settings(iterations=1, simulations=(0, 2, 4, 8), early=2, positions=20, games=4,
                      overrides=(*QUICK_NETWORK, *QUICK_SELFPLAY, "checkpoint.every=1")),
    # ~1,000 games of the recipe (its shipped model took 355 iterations): a young network,
    # whose raw policy still errs on a quarter of the positions. Below 8 simulations the
    # Gumbel root search (8 moves considered) cannot try every column once, so the early
    # doubling compared is 8 -> 16, the first whose search sees every move.
    "full": Settings(iterations=4, simulations=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256), early=8,
                     positions=500, games=64,
                     overrides=("train.min_replay=2048", "checkpoint.every=2")),
}


def arms(scale: str) -> list[ZeroArm]:
    return zero_arms(CONFIG, SETTINGS[scale])


def agreement_share(agent: Agent, positions: int) -> float:
    """The share of the benchmark positions (the first `positions` of each agreement file)
    where `agent`'s move keeps the solver's value."""
    per_file = solver_agreement(agent, AGREEMENT_FILES, limit=positions)
    return sum(r.agreed for r in per_file) / sum(r.positions for r in per_file)


def compute_figures(run: TrainedZeroArm, s: Settings) -> dict[str, list[float]]:
    """For the run's final network and each budget: the share of the benchmark positions
    whose move keeps the solver's value, and (budgets > 0) the score against the network's
    own raw policy."""
    agent = load_network_agent(run.final, 0, game="connect4", seed=run.seed)
    agreement = [agreement_share(agent.with_simulations(sims), s.positions)
                 for sims in s.simulations]
    searched = [n for n in s.simulations if n > 0]
    points = compute_curve(Connect4(), agent, searched, s.games, seed=run.seed)
    return {"agreement": agreement, "score": [0.5] + [p.result.score for p in points]}


def measure(ctx: Context, trained: dict[str, list[TrainedZeroArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    per_seed = judge_at_once(ctx, partial(compute_figures, s=s), trained["alphazero"])
    figures = {key: [seed[key] for seed in per_seed] for key in ("agreement", "score")}
    return {"seeds": list(ctx.seeds), "simulations": list(s.simulations), "early": s.early,
            "files": list(AGREEMENT_FILES), "positions": s.positions * len(AGREEMENT_FILES),
            "games": s.games, **figures}


def doubling_gains(simulations: list[int], values: list[float]) -> dict[int, float]:
    """The gain of each doubling n -> 2n in `simulations` (by n)."""
    at = dict(zip(simulations, values, strict=True))
    return {n: at[2 * n] - at[n] for n in simulations if n > 0 and 2 * n in at}


def compared_doublings(simulations: list[int], early: int) -> tuple[list[int], list[int]]:
    """The doublings the diminishing-returns effect compares, fixed before the run: the two
    from `early` on against the last two (by their starting budget). One doubling against
    one would let the curve's wiggles decide (a non-monotone gain measured 32 -> 64 above
    16 -> 32)."""
    top = simulations[-1]
    return [early, 2 * early], [top // 4, top // 2]


def analyse(numbers: Numbers) -> Analysis:
    sims, agreement, score = numbers["simulations"], numbers["agreement"], numbers["score"]
    top, early = sims[-1], numbers["early"]
    gains = [doubling_gains(sims, per_seed) for per_seed in agreement]
    first, last = compared_doublings(sims, early)

    def mean_gain(g: dict[int, float], doublings: list[int]) -> float:
        return sum(g[n] for n in doublings) / len(doublings)

    effects = [
        Effect(f"solver agreement: {top} simulations - raw policy",
               paired([a[0] for a in agreement], [a[-1] for a in agreement]),
               expected_sign=+1, min_effect=0.02),
        Effect(f"diminishing returns: agreement gained a doubling, {first[0]} -> "
               f"{2 * first[-1]} simulations - {last[0]} -> {top}",
               paired([mean_gain(g, last) for g in gains], [mean_gain(g, first) for g in gains]),
               expected_sign=+1, min_effect=0.01),
        Effect(f"score against the raw policy at {top} simulations - 0.5",
               tuple(s[-1] - 0.5 for s in score), expected_sign=+1, min_effect=0.05,
               primary=False),
    ]
    rows = [[("0 (raw policy)" if n == 0 else str(n)), cell([a[i] for a in agreement]),
             "-" if n == 0 else cell([s[i] for s in score]),
             "-" if i == 0 or n != 2 * sims[i - 1] else cell([g[n // 2] for g in gains])]
            for i, n in enumerate(sims)]
    table = Table(["simulations", "solver agreement", "score vs raw policy",
                   "agreement gained by the doubling"], rows)
    notes = [f"Solver agreement: the share of {numbers['positions']:,} Connect Four benchmark "
             f"positions ({', '.join(numbers['files'])}) where the move keeps the position's "
             "perfect-play value (win/draw/loss); one search per position, no noise. Score: "
             f"{numbers['games']} games against the same network's raw policy per budget, "
             "pairs of games from a random 2-ply opening with colours swapped."]
    mean_gains = {n: mean([g[n] for g in gains]) for n in gains[0]}
    low = [n for n in mean_gains if n < early]
    if low and max(mean_gains[n] for n in low) < mean_gains[early]:
        notes.append(f"Below {early} simulations the curve rises slowly (at most "
                     f"{max(mean_gains[n] for n in low):+.3f} a doubling, against "
                     f"{mean_gains[early]:+.3f} for {early} -> {2 * early}): the Gumbel root "
                     f"search considers up to {early} moves (every legal column) and cannot "
                     "visit each of them once with fewer simulations, so the doublings are "
                     "compared from there.")
    errors = 1.0 - mean([a[-1] for a in agreement])
    notes.append(f"At {top} simulations {errors:.1%} of the positions still get a move that "
                 f"changes their value, against {1.0 - mean([a[0] for a in agreement]):.1%} for "
                 "the raw policy: as the errors run out, each doubling has less left to fix.")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    sims = numbers["simulations"]
    x = [n if n > 0 else 0.5 for n in sims]  # the raw policy at 1/2 on the log axis
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "agreement", "solver agreement (share of positions)"),
                           (axes[1], "score", "score against its own raw policy")):
        band(ax, x, numbers[key], "mean ± SE over seeds", marker="o")
        for seed, values in zip(numbers["seeds"], numbers[key], strict=True):
            ax.plot(x, values, lw=0.8, alpha=0.5, label=f"seed {seed}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, ["raw" if n == 0 else str(n) for n in sims], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("simulations per move")
        ax.set_title(title)
        tidy(ax, legend=False)
    axes[1].axhline(0.5, color="grey", lw=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle("the same network, more search at test time (Connect Four)")
    return save_figure(fig, out)


# minutes: measured 10.7 min (2 seeds, 2 cores, 2026-12-03)
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=5.5, needs_base=False)
