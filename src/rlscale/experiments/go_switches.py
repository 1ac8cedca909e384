"""Zero: KataGo's switches pay on 9x9 Go (Wu 2019, "Accelerating self-play learning in Go").

KataGo's ownership head (an auxiliary target: who owns each point at the end), global
pooling (channel means fed back into the trunk, so a local pattern sees the whole board)
and playout-cap randomisation (a quarter of the moves searched in full and recorded, the
rest searched cheaply and not recorded) are in rlscale's 9x9 recipe
(configs/zero/go9_grow.yaml). Issue 55 keeps a switch only if a seeded comparison says it
pays: here each is turned off alone, the arms trained from the same seed, and each arm's
final network plays the recipe's from the same seed.

Equal cost: the ownership head and global pooling add little to a move's cost, so those arms
play the recipe's number of games. Without playout caps every move is searched with the full
32 simulations where the recipe spends 0.25 x 32 + 0.75 x 8 = 14 on average, so that arm
plays 14/32 of the recipe's games: the same self-play simulations, counted in the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..config import load_config
from ..zero.agents import load_network_agent
from ..zero.config import ZeroConfig
from ..zero.matches import play_match
from .grpo_vs_zero import zero_costs
from .parallel import judge_at_once
from .plots import plt, save_figure, tidy
from .record import Analysis, Table
from .setup import ZERO_CONFIGS, Context, TrainedZeroArm, ZeroArm
from .spec import QUICK_SELFPLAY, Experiment, Numbers, ZeroBudget, zero_arms
from .stats import cell, mean
from .verdict import Effect
from .zero_compute import QUICK_NETWORK

NAME = "go_switches"
CLAIM = ("Zero: KataGo's switches pay on 9x9 Go: from the same seed and the same self-play "
         "cost, the go9 recipe (ownership head, global pooling, playout-cap randomisation) "
         "beats the same recipe with any one of them turned off.")
CONFIG = "go9_grow.yaml"
RECIPE = "recipe"
# The switch each arm turns off; playout caps off also scales its games (below).
SWITCHES = {"no_ownership": ("ownership head", ("network.ownership_head=false",)),
            "no_global_pooling": ("global pooling", ("network.global_pooling=false",)),
            "no_playout_caps": ("playout-cap randomisation", ("selfplay.full_search_prob=1.0",))}
MIN_SCORE_GAIN = 0.05  # the recipe's score over 50%: a switch that pays less is not kept


@dataclass(frozen=True)
class Settings(ZeroBudget):
    games: int        # per match of the recipe against an arm
    simulations: int  # each side's search per move in the matches


def uncapped_iterations(cfg: ZeroConfig) -> int:
    """The iterations without playout caps that cost `cfg`'s iterations in self-play
    simulations: a capped move searches `full_search_prob` x the full budget + the rest x the
    fast one (at least one iteration)."""
    full, p = cfg.mcts.simulations, cfg.selfplay.full_search_prob
    per_move = p * full + (1 - p) * (cfg.selfplay.fast_simulations or full)
    return max(1, round(cfg.train.iterations * per_move / full))


SETUP = ("The 9x9 recipe (configs/zero/go9_grow.yaml: 2 blocks x 48 channels, Gumbel search "
         "at 32 simulations, playout caps 8/32 at 25%, ownership head, global pooling) for "
         "48 iterations of 128 games from a random network, and the same with one switch off: "
         "no ownership head, no global pooling (48 iterations each), no playout caps (21 "
         "iterations: the recipe's self-play simulations). Each arm's final network plays the "
         "recipe's of the same seed, 100 games at 32 simulations a side, colours alternating "
         "from shared 2-ply random openings; the effect is the recipe's score minus 50%.")
SETTINGS = {
    # global pooling needs 2 blocks: the quick network is zero_compute's, one block deeper
    "quick": Settings(iterations=1, games=2, simulations=2,
                      overrides=(*QUICK_NETWORK, "network.blocks=2", *QUICK_SELFPLAY)),
    "full": Settings(iterations=48, games=100, simulations=32, overrides=()),
}


def arms(scale: str) -> list[ZeroArm]:
    s = SETTINGS[scale]
    own = {RECIPE: (), **{label: overrides for label, (_, overrides) in SWITCHES.items()}}
    out = zero_arms(CONFIG, s, own)
    recipe = load_config(ZeroConfig, ZERO_CONFIGS / CONFIG, list(out[0].overrides))
    equal_cost = f"train.iterations={uncapped_iterations(recipe)}"
    return [ZeroArm(a.label, a.config, (*a.overrides, equal_cost))
            if a.label == "no_playout_caps" else a for a in out]


def run_figures(run: TrainedZeroArm) -> dict[str, float]:
    """What the run spent: games, self-play simulations (network evaluations), learner
    steps, and minutes by its own clock."""
    rows = run.metrics()
    seconds = [r["counters/seconds"] for r in rows if "counters/seconds" in r]
    steps = [r["counters/learner_steps"] for r in rows if "counters/learner_steps" in r]
    costs = zero_costs(run)
    return {"games": costs["games"], "simulations": costs["evaluations"],
            "learner_steps": steps[-1] if steps else 0,
            "minutes": seconds[-1] / 60 if seconds else 0.0}


def recipe_score(pair: tuple[TrainedZeroArm, TrainedZeroArm], s: Settings) -> dict:
    """The recipe's network against another arm's of the same seed (the pair), both
    searching `s.simulations` a move."""
    recipe, other = pair
    a = load_network_agent(recipe.final, s.simulations, game="go", seed=recipe.seed,
                           name=RECIPE)
    b = load_network_agent(other.final, s.simulations, game="go", seed=recipe.seed + 1,
                           name=other.arm.label)
    result = play_match(a.model.game, a, b, s.games, seed=recipe.seed)
    return {"wins": result.wins, "draws": result.draws, "losses": result.losses,
            "score": (result.wins + result.draws / 2) / result.games}


def match_name(pair: tuple[TrainedZeroArm, TrainedZeroArm], s: Settings) -> str:
    """The file a match is kept in (experiments.parallel.judge_at_once): the arm, the seed,
    the match's settings and both networks' fingerprints."""
    recipe, other = pair
    return (f"{other.arm.label}_s{recipe.seed}_vs_{RECIPE}_{s.games}games_{s.simulations}sims_"
            f"{recipe.fingerprint()}_{other.fingerprint()}")


def measure(ctx: Context, trained: dict[str, list[TrainedZeroArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    pairs = [pair for label in SWITCHES
             for pair in zip(trained[RECIPE], trained[label], strict=True)]
    scores = judge_at_once(ctx, partial(recipe_score, s=s), pairs,
                           saved_as=partial(match_name, s=s))
    n = len(ctx.seeds)  # the pairs run switch by switch, seed by seed
    return {"seeds": list(ctx.seeds), "games": s.games, "simulations": s.simulations,
            "runs": {label: [run_figures(r) for r in runs] for label, runs in trained.items()},
            "matches": {label: scores[i * n:(i + 1) * n] for i, label in enumerate(SWITCHES)}}


def analyse(numbers: Numbers) -> Analysis:
    matches, runs = numbers["matches"], numbers["runs"]
    effects = [Effect(f"{switch}: recipe's score against the recipe without it - 0.5",
                      tuple(m["score"] - 0.5 for m in matches[label]), expected_sign=+1,
                      min_effect=MIN_SCORE_GAIN)
               for label, (switch, _) in SWITCHES.items()]
    rows = []
    for label in (RECIPE, *SWITCHES):
        figures = runs[label]
        match = ("-" if label == RECIPE else
                 " / ".join(str(sum(m[k] for m in matches[label]))
                            for k in ("wins", "draws", "losses")))
        rows.append([label, cell([f["games"] for f in figures], 0),
                     cell([f["simulations"] / 1e6 for f in figures], 1),
                     cell([f["learner_steps"] for f in figures], 0),
                     cell([f["minutes"] for f in figures], 1), match,
                     "-" if label == RECIPE else cell([m["score"] for m in matches[label]])])
    table = Table(["arm", "self-play games", "self-play simulations (M)", "learner steps",
                   "minutes (run's clock)", "recipe's W / D / L, all seeds",
                   "recipe's score"], rows)
    notes = [f"Each seed: {numbers['games']} games of the recipe's final network against each "
             f"arm's, {numbers['simulations']} simulations a side with each network's own "
             "search settings, colours alternating, each pair of games from a shared random "
             "2-ply opening. A switch pays when the recipe scores above 50% against the "
             f"recipe without it by at least {MIN_SCORE_GAIN:g}.",
             "Minutes are each run's own clock, on a machine shared with other jobs: read the "
             "simulations as the cost."]
    spent = [mean([f["simulations"] for f in runs[label]]) for label in (RECIPE, "no_playout_caps")]
    if spent[0] > 0:
        notes.append(f"Without playout caps the arm spent {spent[1] / spent[0]:.2f}x the "
                     "recipe's self-play simulations (the design aims at 1x).")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    labels = list(SWITCHES)
    for i, label in enumerate(labels):
        scores = [m["score"] for m in numbers["matches"][label]]
        ax.scatter([i] * len(scores), scores, color="C0", alpha=0.6,
                   label="one seed" if i == 0 else None)
        ax.hlines(mean(scores), i - 0.25, i + 0.25, color="C1",
                  label="mean over seeds" if i == 0 else None)
    ax.axhline(0.5, color="grey", ls="--", lw=1)
    ax.set_xticks(range(len(labels)), [SWITCHES[label][0] for label in labels])
    ax.set_ylim(0, 1)
    ax.set_xlabel("switch turned off")
    ax.set_ylabel("the recipe's score against that arm")
    ax.set_title(f"9x9 Go: the recipe against itself without one switch "
                 f"({numbers['games']} games a seed)")
    tidy(ax)
    return save_figure(fig, out)


# minutes: measured 2026-12-06 (AMD EPYC, AVX2, one thread a run, two runs at once): a recipe
# iteration 65-70 s, so ~55 core-minutes for each 48-iteration arm and about as much for the
# uncapped arm's 21 (2.3x the search a move), plus three 100-game matches (~5 min each):
# ~235 core-minutes a seed, ~118 minutes on 2 cores with --jobs 2
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=118,
                        needs_base=False)
