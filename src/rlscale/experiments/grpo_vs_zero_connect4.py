"""grpo_vs_zero on Connect Four: GRPO, which has no search, against AlphaZero at an equal
number of network evaluations while playing, on a game whose positions no run can cover.

The arms are grpo_vs_zero's (experiments/grpo_vs_zero.py): AlphaZero is
configs/zero/connect4.yaml (Gumbel search, 32 simulations a move) for a short budget; GRPO
(experiments/game_grpo.py) starts from a fresh network of the same shape and plays groups of
games until it has evaluated as many positions as that seed's AlphaZero run did in self-play.
Each arm's final network is judged two ways, both as its raw policy (the most probable legal
move, no search):
- solver agreement (zero_compute's): the share of the Connect Four benchmark positions
  where its move keeps the perfect solver's win/draw/loss value; also with a small search of
  each network, reported beside it;
- Elo (zero_elo's Bradley-Terry fit): both raw policies and fixed anchors (random play, pure
  MCTS) in one fit per seed, random at 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..zero.agents import NetworkAgent, load_network_agent, make_agent
from ..zero.elo_curve import play_pairings, schedule
from ..zero.games.connect4 import Connect4
from ..zero.model import Model
from ..zero.network import PolicyValueNet
from ..zero.perfect_play import AGREEMENT_FILES
from ..zero.ratings import fit_ratings
from .grpo_vs_zero import SCORE_POINTS, grpo_at_budget, zero_costs
from .grpo_vs_zero import Settings as GRPOvsZeroBudget
from .parallel import judge_at_once
from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Context, TrainedZeroArm, ZeroArm
from .spec import QUICK_SELFPLAY, Experiment, Numbers, zero_arms
from .stats import cell, mean, paired
from .verdict import Effect, estimate
from .zero_compute import QUICK_NETWORK, agreement_share

NAME = "grpo_vs_zero_connect4"
CLAIM = ("GRPO is what remains when search is unaffordable: on Connect Four, at an equal number "
         "of network evaluations while playing, AlphaZero's search-distilled raw policy keeps "
         "a perfect solver's value more often, and is rated higher in Elo, than a raw policy "
         "trained by GRPO on groups of sampled games.")
CONFIG = "connect4.yaml"
PLAYERS = ("alphazero", "grpo")


@dataclass(frozen=True)
class Settings(GRPOvsZeroBudget):
    judged: int                  # benchmark positions per agreement file
    simulations: int             # the small search both networks are also judged with
    games: int                   # games per Elo pairing
    anchors: tuple[str, ...]     # fixed players (arena specs); the first is rated 0


SETUP = ("AlphaZero on Connect Four (configs/zero/connect4.yaml, Gumbel search with 32 "
         "simulations a move) for 2 iterations of 256 games; GRPO from a fresh network of "
         "the same shape, groups of 8 games from each of 32 random openings a step (both "
         "sides sampled from the policy, reward = the outcome for the start player, "
         "group-mean baseline with std normalisation, one on-policy update), until it has "
         "evaluated as many positions as that seed's AlphaZero self-play; both raw policies "
         "judged by solver agreement on 1,500 benchmark positions and rated with random "
         "play and pure MCTS (25 and 100 playouts) in one Elo fit, 40 games per pairing.")
SETTINGS = {
    # One thread: the quick network's calls are a few positions each, where a second thread
    # buys nothing and, on a busy machine, costs several times the call.
    "quick": Settings(iterations=1, positions=8, group=4, judged=20, simulations=4, games=4,
                      anchors=("random", "mcts:8"),
                      overrides=(*QUICK_NETWORK, *QUICK_SELFPLAY, "train.threads=1")),
    # ~520 games of the recipe, half of zero_compute's: GRPO's learner trains on every move
    # it evaluates (~14x the positions AlphaZero's trains on at this budget), and it is what
    # sets most of the wall time (21.4 minutes for 2 seeds on the AVX2 EPYC).
    "full": Settings(iterations=2, positions=32, group=8, judged=500, simulations=16, games=40,
                     anchors=("random", "mcts:25", "mcts:100"),
                     overrides=("train.min_replay=2048",)),
}


def arms(scale: str) -> list[ZeroArm]:
    return zero_arms(CONFIG, SETTINGS[scale])


def raw_policy(net: PolicyValueNet) -> NetworkAgent:
    return NetworkAgent(Model(Connect4(), net), 0)


def score_raw_policy(net: PolicyValueNet, positions: int) -> float:
    """The solver agreement of `net`'s raw policy on `positions` positions of each file."""
    return agreement_share(raw_policy(net), positions)


def judge_run(run: TrainedZeroArm, s: Settings, threads: int) -> dict:
    """Both arms of one seed: GRPO trained at the AlphaZero run's budget (with at most
    `threads` threads: 0, its config's), then both networks' solver agreement (raw and
    searched) and the Elo of their raw policies among the anchors."""
    game = Connect4()
    alphazero = load_network_agent(run.final, 0, game="connect4", seed=run.seed,
                                   name="alphazero")
    net, progress = grpo_at_budget(run, game, s.positions, s.group,
                                   partial(score_raw_policy, positions=s.judged),
                                   max_threads=threads)
    # GRPO's network searches with the settings AlphaZero's plays with (its value head is
    # the fresh network's: GRPO never trains it).
    grpo = NetworkAgent(Model(game, net, alphazero.model.mcts, seed=run.seed), 0, "grpo")
    players = {"alphazero": alphazero, "grpo": grpo}
    anchors = {spec: make_agent(spec, "connect4", None, 0, "trained", run.seed + 1000 + i)
               for i, spec in enumerate(s.anchors)}
    pairs = schedule(list(players), list(s.anchors), neighbours=len(players))
    results = play_pairings(game, {**anchors, **players}, pairs, s.games, seed=run.seed)
    ratings = fit_ratings(results, s.anchors[0])
    figures = {name: {"agreement": agreement_share(agent, s.judged),
                      "searched": agreement_share(agent.with_simulations(s.simulations),
                                                  s.judged),
                      "elo": ratings[name].elo, "low": ratings[name].low,
                      "high": ratings[name].high}
               for name, agent in players.items()}
    figures["alphazero"].update(zero_costs(run))
    figures["grpo"].update(evaluations=progress.evaluations, games=progress.games,
                           trained_positions=progress.moves_trained, steps=progress.steps,
                           curve=[score for _, score in progress.curve])
    anchor_elo = {name: [ratings[name].elo, ratings[name].low, ratings[name].high]
                  for name in s.anchors}
    return {**figures, "anchors": anchor_elo, "pairings": len(results)}


def measure(ctx: Context, trained: dict[str, list[TrainedZeroArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    per_seed = judge_at_once(ctx, partial(judge_run, s=s, threads=ctx.threads),
                             trained["alphazero"])
    arms_out = {name: {key: [seed[name][key] for seed in per_seed] for key in per_seed[0][name]}
                for name in PLAYERS}
    return {"seeds": list(ctx.seeds), "positions": s.positions, "group": s.group,
            "score_points": SCORE_POINTS, "files": list(AGREEMENT_FILES),
            "judged": s.judged * len(AGREEMENT_FILES), "simulations": s.simulations,
            "games": s.games, "anchors": list(s.anchors),
            "pairings": per_seed[0]["pairings"], "arms": arms_out,
            "anchor_elo": {name: [seed["anchors"][name] for seed in per_seed]
                           for name in s.anchors}}


def analyse(numbers: Numbers) -> Analysis:
    az, grpo = numbers["arms"]["alphazero"], numbers["arms"]["grpo"]
    sims = numbers["simulations"]
    effects = [
        Effect("raw-policy solver agreement: AlphaZero - GRPO",
               paired(grpo["agreement"], az["agreement"]), expected_sign=+1, min_effect=0.01),
        Effect("raw-policy Elo: AlphaZero - GRPO", paired(grpo["elo"], az["elo"]),
               expected_sign=+1, min_effect=50.0),
        Effect(f"solver agreement with {sims} simulations: AlphaZero - GRPO",
               paired(grpo["searched"], az["searched"]), expected_sign=+1, min_effect=0.01,
               primary=False),
    ]

    def half_width(low: list[float], high: list[float]) -> str:
        return f"± {mean([(h - lo) / 2 for lo, h in zip(low, high, strict=True)]):.0f}"

    rows = [[label, cell(arm["agreement"]), cell(arm["searched"]), cell(arm["elo"], 0),
             half_width(arm["low"], arm["high"]), cell(arm["evaluations"], 0),
             cell(arm["games"], 0), cell(arm["trained_positions"], 0)]
            for label, arm in (("AlphaZero (search, distilled)", az),
                               (f"GRPO ({numbers['positions']} positions x "
                                f"{numbers['group']} games a step)", grpo))]
    for name in numbers["anchors"]:
        values = numbers["anchor_elo"][name]
        rows.append([f"anchor {name}", "-", "-", cell([v[0] for v in values], 0),
                     "fixed" if name == numbers["anchors"][0]
                     else half_width([v[1] for v in values], [v[2] for v in values]),
                     "-", "-", "-"])
    table = Table(["player", "raw policy: solver agreement",
                   f"{sims} simulations: solver agreement", "raw policy: Elo",
                   "95% interval of the fit (mean half-width)",
                   "network evaluations while playing", "games", "positions trained"], rows)
    notes = [f"Solver agreement: the share of {numbers['judged']:,} Connect Four benchmark "
             f"positions ({', '.join(numbers['files'])}) where the move keeps the position's "
             "perfect-play value (win/draw/loss); the raw policy plays the most probable legal "
             f"move, the searched column each network with {sims} simulations of the search "
             "AlphaZero plays with (GRPO's value head is the fresh network's: GRPO never "
             "trains it). The budget is AlphaZero's self-play simulations, matched per seed; "
             "the learners' work (positions trained) is shown, not matched.",
             f"Elo: per seed, both raw policies and the anchors ({', '.join(numbers['anchors'])}"
             "; mcts:N is pure MCTS with N random playouts a move) in one Bradley-Terry fit, "
             f"{numbers['anchors'][0]} at 0: {numbers['games']} games per pairing (pairs from "
             "a random 2-ply opening, colours swapped), every player against every other, "
             f"{numbers['pairings']} pairings a seed; one virtual draw per pairing."]
    curves = grpo["curve"]
    start, half, end = (mean([c[i] for c in curves]) for i in (0, len(curves[0]) // 2, -1))
    notes.append(f"GRPO's raw-policy solver agreement: {start:.3f} for the fresh network, "
                 f"{half:.3f} at half the budget, {end:.3f} at the end (AlphaZero's: "
                 f"{mean(az['agreement']):.3f}).")
    if end - half > 0.02:
        notes.append("GRPO was still improving when the budget ran out: the comparison is "
                     "at this budget, not at convergence.")
    if sum(az["trained_positions"]):
        trained = sum(grpo["trained_positions"]) / sum(az["trained_positions"])
        notes.append(f"GRPO's learner trained on {trained:.1f}x as many positions as "
                     f"AlphaZero's ({mean(grpo['games']):,.0f} games a seed against "
                     f"{mean(az['games']):,.0f}): equal evaluations in play are not equal "
                     "learner work.")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    az, grpo = numbers["arms"]["alphazero"], numbers["arms"]["grpo"]
    budget = mean(az["evaluations"])
    points = numbers["score_points"]
    x = [budget * k / points for k in range(points + 1)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    band(ax, x, grpo["curve"], "GRPO (raw policy)")
    ax.scatter([budget], [mean(az["agreement"])], color="C1", zorder=3,
               label="AlphaZero's final raw policy")
    ax.set_xlabel("network evaluations while playing (AlphaZero: simulations)")
    ax.set_title("share of positions where the raw policy keeps the solver's value")
    tidy(ax)
    ax = axes[1]
    labels = ["AlphaZero", "GRPO", *numbers["anchors"]]
    elo = [az["elo"], grpo["elo"], *([v[0] for v in numbers["anchor_elo"][name]]
                                     for name in numbers["anchors"])]
    ax.errorbar(range(len(labels)), [mean(e) for e in elo], fmt="o", capsize=3,
                yerr=[estimate(e).se or 0.0 for e in elo])
    for i, e in enumerate(elo):
        ax.scatter([i] * len(e), e, color="grey", s=10, zorder=3)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(f"Elo ({numbers['anchors'][0]} = 0)")
    ax.set_title("raw policies and anchors in one fit (mean ± SE; dots: seeds)")
    tidy(ax, axis="y", legend=False)
    fig.suptitle("GRPO vs AlphaZero at equal network evaluations (Connect Four)")
    return save_figure(fig, out)


EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=10.5, needs_base=False)
