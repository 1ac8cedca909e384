"""GRPO is what remains when search is unaffordable: a group of games from one position, the
terminal reward, the group's mean as the baseline, no search and no value head. AlphaZero
spends its network evaluations on search instead, and distils the search into the policy.
At an equal number of network evaluations while playing, which policy is better?

Tic-tac-toe judges both exactly (experiments/tictactoe_exact.py): each arm's raw policy (its
most probable legal move) on all 4,520 positions, and the games it loses against a perfect
player. The AlphaZero arm is configs/zero/tictactoe.yaml (32 simulations a move) for a short
budget; the GRPO arm (experiments/game_grpo.py) starts from the same network architecture and
plays until it has evaluated as many positions as that seed's AlphaZero run did in
self-play (its simulations), i.e. ~32 times as many games. The learners' costs differ and are
shown beside it: AlphaZero trains each sampled position several times (`sample_reuse`), GRPO
each move once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import load_config
from ..zero.config import ZeroConfig
from ..zero.games.base import Game
from ..zero.games.tictactoe import TicTacToe
from ..zero.network import PolicyValueNet, load_network, network_for
from .game_grpo import GRPOGameSettings, Progress, train_grpo
from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import ZERO_CONFIGS, Context, TrainedZeroArm, ZeroArm, capped_threads
from .spec import QUICK_SELFPLAY, Experiment, Numbers, ZeroBudget, zero_arms
from .stats import cell, paired
from .tictactoe_exact import judge_raw_policy
from .verdict import Effect

NAME = "grpo_vs_zero"
CLAIM = ("GRPO is what remains when search is unaffordable: at an equal number of network "
         "evaluations while playing, AlphaZero's search-distilled policy plays the optimal "
         "move more often than a policy trained by GRPO on groups of sampled games "
         "(tic-tac-toe, judged against the exact solution).")
CONFIG = "tictactoe.yaml"
SCORE_POINTS = 10           # the GRPO curve: the raw policy judged at every tenth of the budget


@dataclass(frozen=True)
class Settings(ZeroBudget):
    positions: int              # GRPO: start positions per step
    group: int                  # GRPO: games from each


SETUP = ("AlphaZero on tic-tac-toe (configs/zero/tictactoe.yaml, 32 simulations a move) for "
         "8 iterations of 128 games; GRPO from a fresh network of the same shape, groups of "
         "8 games from each of 64 random openings a step (both sides sampled from the "
         "policy, reward = the outcome for the start player, group-mean baseline with std "
         "normalisation, one on-policy update), until it has evaluated as many positions "
         "as that seed's AlphaZero self-play; both raw policies judged against the exact "
         "solution.")
SETTINGS = {
    "quick": Settings(iterations=2, positions=16, group=4, overrides=(
        *QUICK_SELFPLAY, "checkpoint.every=1")),
    # As zero_value_target's and zero_prior's full runs: ~1,000 AlphaZero games, early in
    # the recipe (perfect play comes at ~30 iterations).
    "full": Settings(iterations=8, positions=64, group=8, overrides=("checkpoint.every=4",)),
}


def arms(scale: str) -> list[ZeroArm]:
    return zero_arms(CONFIG, SETTINGS[scale])


def selfplay_evaluations(run: TrainedZeroArm) -> int:
    """The network positions a Zero run evaluated in self-play: its simulations, summed over
    the iterations (each logs its rate and its self-play seconds)."""
    return round(sum(r["speed/simulations_per_second"] * r["speed/selfplay_seconds"]
                     for r in run.metrics() if "speed/selfplay_seconds" in r))


def learner_positions(run: TrainedZeroArm) -> int:
    """Positions the Zero run's learner trained on (steps x batch)."""
    cfg = load_config(ZeroConfig, ZERO_CONFIGS / run.arm.config, list(run.recipe))
    steps = [r["counters/learner_steps"] for r in run.metrics() if "counters/learner_steps" in r]
    return (steps[-1] if steps else 0) * cfg.train.batch_size


def zero_costs(run: TrainedZeroArm) -> dict[str, int]:
    """What a Zero run spent: network evaluations in self-play, games, positions trained."""
    games = [r["counters/games"] for r in run.metrics() if "counters/games" in r]
    return {"evaluations": selfplay_evaluations(run), "games": games[-1] if games else 0,
            "trained_positions": learner_positions(run)}


def grpo_at_budget(run: TrainedZeroArm, game: Game, positions: int, group: int,
                   score: Callable[[PolicyValueNet], float],
                   max_threads: int = 0) -> tuple[PolicyValueNet, Progress]:
    """GRPO from a fresh network of the Zero run's shape (its config's network, learning rate,
    weight decay and threads, at most `max_threads` of them where > 0; its seed) until it has
    evaluated as many positions as the run did in self-play; `score(net)` at the start and
    after each `1/SCORE_POINTS` of that."""
    cfg = load_config(ZeroConfig, ZERO_CONFIGS / run.arm.config, list(run.recipe))
    torch.set_num_threads(capped_threads(cfg.train.threads, max_threads))
    torch.manual_seed(run.seed)
    net = network_for(game, cfg.network)
    progress = train_grpo(
        game, net, GRPOGameSettings(evaluations=selfplay_evaluations(run), positions=positions,
                                    group=group, lr=cfg.train.lr,
                                    weight_decay=cfg.train.weight_decay),
        seed=run.seed, score=score, score_points=SCORE_POINTS)
    return net, progress


def grpo_run(run: TrainedZeroArm, s: Settings) -> dict:
    """GRPO from a fresh network of the AlphaZero run's shape, at that run's budget."""
    net, progress = grpo_at_budget(run, TicTacToe(), s.positions, s.group,
                                   lambda n: judge_raw_policy(n).optimal_moves)
    final = judge_raw_policy(net)
    return {"optimal_moves": final.optimal_moves, "raw_lost": final.lost,
            "evaluations": progress.evaluations, "games": progress.games,
            "steps": progress.steps, "trained_positions": progress.moves_trained,
            "curve": [score for _, score in progress.curve]}


def measure(ctx: Context, trained: dict[str, list[TrainedZeroArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    alphazero: dict[str, list] = {k: [] for k in (
        "optimal_moves", "raw_lost", "evaluations", "games", "trained_positions")}
    grpo: dict[str, list] = {k: [] for k in (
        "optimal_moves", "raw_lost", "evaluations", "games", "trained_positions", "steps",
        "curve")}
    for run in trained["alphazero"]:
        raw = judge_raw_policy(load_network(run.final, "tictactoe", {})[0])
        costs = zero_costs(run)
        for key, value in (("optimal_moves", raw.optimal_moves), ("raw_lost", raw.lost),
                           *costs.items()):
            alphazero[key].append(value)
        for key, value in grpo_run(run, s).items():
            grpo[key].append(value)
    return {"seeds": list(ctx.seeds), "positions": s.positions, "group": s.group,
            "score_points": SCORE_POINTS, "arms": {"alphazero": alphazero, "grpo": grpo}}


def analyse(numbers: Numbers) -> Analysis:
    az, grpo = numbers["arms"]["alphazero"], numbers["arms"]["grpo"]
    effects = [
        Effect("raw-policy optimal moves: AlphaZero - GRPO",
               paired(grpo["optimal_moves"], az["optimal_moves"]), expected_sign=+1,
               min_effect=0.01),
        Effect("games lost to a perfect player: GRPO - AlphaZero",
               paired(az["raw_lost"], grpo["raw_lost"]), expected_sign=+1, min_effect=0.01,
               primary=False),
    ]
    rows = [[label, cell(arm["optimal_moves"]), cell(arm["raw_lost"]),
             cell(arm["evaluations"], 0), cell(arm["games"], 0),
             cell(arm["trained_positions"], 0)]
            for label, arm in (("AlphaZero (search, distilled)", az),
                               (f"GRPO ({numbers['positions']} positions x "
                                f"{numbers['group']} games a step)", grpo))]
    table = Table(["arm", "raw policy: optimal move", "raw policy: games lost",
                   "network evaluations while playing", "games", "positions trained"], rows)
    notes = ["Both arms are judged by their raw policy (no search at test time) over all "
             "4,520 tic-tac-toe positions with a move to play, and against a perfect player "
             "that tries every optimal reply, as either side; exact, no sampling. The budget "
             "is AlphaZero's self-play simulations, matched per seed; the learners' work "
             "(positions trained) is shown, not matched."]
    curves = grpo["curve"]
    start, half, end = (sum(c[i] for c in curves) / len(curves)
                        for i in (0, len(curves[0]) // 2, -1))
    notes.append(f"GRPO's optimal-move share: {start:.3f} for the fresh network, {half:.3f} "
                 f"at half the budget, {end:.3f} at the end.")
    if end - half > 0.02:
        notes.append("GRPO was still improving when the budget ran out: the comparison is "
                     "at this budget, not at convergence.")
    trained = (sum(grpo["trained_positions"]) / sum(az["trained_positions"])
               if sum(az["trained_positions"]) else float("inf"))
    if effects[0].verdict != "supports" and trained > 2:
        notes.append(f"GRPO's learner trained on {trained:.1f}x as many positions as "
                     "AlphaZero's: equal evaluations in play are not equal learner work, and "
                     "tic-tac-toe is small enough for GRPO's many sampled games "
                     f"({sum(grpo['games']) / len(grpo['games']):,.0f} per seed) to visit "
                     "most positions, where search's better targets from fewer games would "
                     "matter more on a game whose positions no run can cover.")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    az, grpo = numbers["arms"]["alphazero"], numbers["arms"]["grpo"]
    budget = sum(az["evaluations"]) / len(az["evaluations"])
    points = numbers["score_points"]
    x = [budget * k / points for k in range(points + 1)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    band(ax, x, grpo["curve"], "GRPO (raw policy)")
    mean_az = sum(az["optimal_moves"]) / len(az["optimal_moves"])
    ax.scatter([budget], [mean_az], color="C1", zorder=3, label="AlphaZero's final raw policy")
    ax.set_xlabel("network evaluations while playing (AlphaZero: simulations)")
    ax.set_title("share of positions where the raw policy's move is optimal")
    tidy(ax)
    ax = axes[1]
    labels = ["AlphaZero", "GRPO"]
    means = [sum(a["raw_lost"]) / len(a["raw_lost"]) for a in (az, grpo)]
    ax.bar(range(2), means, tick_label=labels, color=["C1", "C0"])
    ax.set_title("raw policy: share of a perfect player's games lost")
    tidy(ax, axis="y", legend=False)
    return save_figure(fig, out)


# minutes: measured 3.8 min with --seeds 4 (2026-12-03, 2 threads)
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=1, needs_base=False)
