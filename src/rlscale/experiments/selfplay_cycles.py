"""Self-play converges or cycles depending on the game, not the loop: AlphaZero's loop (search
against the current network, then distil the network towards the search) reduced to a
one-shot, two-player, symmetric zero-sum matrix game, in numpy alone.

Why a matrix game and not a board game: by Zermelo's theorem (minimax by backward
induction) every finite zero-sum game of perfect information has a pure-strategy
equilibrium that backward induction finds, so a search that reaches the game's end plays
it and exact self-play has nothing to cycle around. A game with no pure equilibrium, where
every strategy is beaten by another, needs simultaneous (hidden) moves, and
rock-paper-scissors is the smallest.

The reduced loop, per iteration:

- the network is a logits vector over the actions, its policy `pi = softmax(logits)`;
- search: each action's expected payoff against the current policy, `q = A @ pi` (exact:
  the one-ply search whose opponent is the current network), and the search policy
  `softmax(q / temperature)`. A low temperature makes the search policy sharpen towards
  the best response to the network, as many simulations do in AlphaZero;
- distillation: a few gradient steps of the cross-entropy from `pi` to the search policy on
  the logits (its gradient is `pi - target`), at a learning rate.

Exploitability is what a best response gains against the policy, `max(A pi) - pi A pi`; A is
antisymmetric (a symmetric zero-sum game), so the game's value and `pi A pi` are 0 and it
is `max_a (A pi)_a`. It is recorded for the last iterate and for the running time average.

Why RPS cycles here: its equilibrium (uniform) is a fixed point of the loop. Near it, an
iteration moves the policy a share `s = 1 - (1 - lr/3)^steps` of the way to the search
policy, so the linearised loop has eigenvalues `1 - s ± i s sqrt(3) / (3 temperature)`;
when `s > 6 t^2 / (1 + 3 t^2)` (t the temperature) their modulus exceeds 1 and the
equilibrium repels: the iterates spiral out to a cycle R -> P -> S whose time average is
still the equilibrium (at the settings here, temperature 0.05 and 4 steps of lr 0.25, a
6-iteration cycle whose leading action has probability about 0.58). A soft search with tiny steps converges instead (continuous-time
logit dynamics do, in zero-sum games); a sharp search with real steps, as AlphaZero's,
does not. In the transitive "strength" game (action i beats j iff i > j) the strongest
action is a pure equilibrium, every search points at it, and the loop settles there.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Context, ZeroArm
from .spec import Experiment, Numbers
from .stats import by_seed, cell, paired
from .verdict import Effect

NAME = "selfplay_cycles"
CLAIM = ("Self-play's convergence is a property of the game: the same Zero loop (search "
         "against the current policy, the network distilled towards the search) settles on "
         "the equilibrium of a transitive zero-sum game but keeps cycling on "
         "rock-paper-scissors, whose last iterate stays exploitable while its time average "
         "converges.")
STRENGTHS = 5   # actions of the transitive game


def rock_paper_scissors() -> np.ndarray:
    """Row player's payoff: paper beats rock, scissors beats paper, rock beats scissors."""
    return np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])


def strength_game(actions: int) -> np.ndarray:
    """Action i beats j iff i > j (payoff sign(i - j)): transitive, its strongest action the
    pure equilibrium."""
    strengths = np.arange(actions)
    return np.sign(np.subtract.outer(strengths, strengths)).astype(float)


# name -> (payoff matrix, action labels)
GAMES: dict[str, tuple[np.ndarray, tuple[str, ...]]] = {
    "rps": (rock_paper_scissors(), ("rock", "paper", "scissors")),
    "transitive": (strength_game(STRENGTHS), tuple(f"s{i}" for i in range(STRENGTHS))),
}
LABELS = {"rps": "rock-paper-scissors", "transitive": f"strength game ({STRENGTHS} actions)"}


@dataclass(frozen=True)
class Settings:
    iterations: int       # of the loop: one search, one distillation
    record_every: int     # iterations between the recorded points of the curves; divides them
    trajectory: int       # the first iterations whose policies are kept (the figure's panel)
    temperature: float    # of the search policy softmax(q / temperature)
    learning_rate: float  # of the distillation's gradient steps on the logits
    distill_steps: int    # per iteration


SETUP = ("A logits vector as the network, a one-ply exact search against the current policy "
         "(q = A pi, search policy softmax(q / 0.05)) and 4 gradient steps (lr 0.25) of "
         "cross-entropy towards it per iteration, from random logits, on rock-paper-scissors "
         f"and on a {STRENGTHS}-action transitive strength game; the exploitability of the last "
         "iterate and of the running average policy, and the policy's change per iteration.")
SETTINGS = {
    "quick": Settings(iterations=300, record_every=5, trajectory=30, temperature=0.05,
                      learning_rate=0.25, distill_steps=4),
    "full": Settings(iterations=5000, record_every=25, trajectory=30, temperature=0.05,
                     learning_rate=0.25, distill_steps=4),
}


def arms(scale: str) -> list[ZeroArm]:
    return []  # nothing is trained by the loops: the reduced loop runs inside `measure`


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def exploitability(game: np.ndarray, policy: np.ndarray) -> float:
    """What a best response gains against `policy`: max_a (A pi)_a - pi A pi (the value of a
    symmetric zero-sum game is 0, so this is the gap to the equilibrium)."""
    payoffs = game @ policy
    return float(payoffs.max() - policy @ payoffs)


def search_policy(game: np.ndarray, policy: np.ndarray, temperature: float) -> np.ndarray:
    """The improved policy of a search whose opponent is the current network: each action's
    exact value against it, sharpened towards the best response by the temperature."""
    return softmax(game @ policy / temperature)


def distill(logits: np.ndarray, target: np.ndarray, s: Settings) -> np.ndarray:
    """Gradient steps of cross-entropy(target, softmax(logits)) on the logits."""
    for _ in range(s.distill_steps):
        logits = logits - s.learning_rate * (softmax(logits) - target)
    return logits


def selfplay(game: np.ndarray, seed: int, s: Settings) -> dict[str, list | float | int]:
    """One run of the loop from random logits: the exploitability of the last iterate and of
    the time-average policy every `record_every` iterations (iteration 0: the initial
    policy), the cycling over the last half, and the first `trajectory` policies."""
    logits = np.random.default_rng(seed).normal(size=len(game))
    policies = [softmax(logits)]
    for _ in range(s.iterations):
        logits = distill(logits, search_policy(game, policies[-1], s.temperature), s)
        policies.append(softmax(logits))
    history = np.array(policies)
    averages = np.cumsum(history, axis=0) / np.arange(1, len(history) + 1)[:, None]
    points = range(0, s.iterations + 1, s.record_every)
    late = history[s.iterations // 2:]
    return {"last": [exploitability(game, history[t]) for t in points],
            "average": [exploitability(game, averages[t]) for t in points],
            "cycling": float(0.5 * np.abs(np.diff(late, axis=0)).sum(axis=1).mean()),
            "argmax_changes": int((np.diff(late.argmax(axis=1)) != 0).sum()),
            "trajectory": history[:s.trajectory + 1].tolist()}


def equilibrium_growth(s: Settings) -> float:
    """The modulus of the linearised loop's eigenvalues at RPS's uniform equilibrium (see the
    module docstring): above 1 the equilibrium repels and the iterates cycle."""
    share = 1.0 - (1.0 - s.learning_rate / 3.0) ** s.distill_steps
    return math.hypot(1.0 - share, share * math.sqrt(3.0) / (3.0 * s.temperature))


def measure(ctx: Context, trained: dict[str, list]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    games = {name: {"actions": list(actions),
                    **by_seed([selfplay(game, seed, s) for seed in ctx.seeds])}
             for name, (game, actions) in GAMES.items()}
    return {"seeds": list(ctx.seeds), "settings": asdict(s),
            "iterations": list(range(0, s.iterations + 1, s.record_every)),
            "equilibrium_growth": equilibrium_growth(s), "games": games}


def at_end(numbers: Numbers, game: str, curve: str) -> list[float]:
    """Per seed: the curve's value after the last iteration."""
    return [values[-1] for values in numbers["games"][game][curve]]


def analyse(numbers: Numbers) -> Analysis:
    games = numbers["games"]
    effects = [
        Effect("last-iterate exploitability at the end: RPS - transitive game",
               paired(at_end(numbers, "transitive", "last"), at_end(numbers, "rps", "last")),
               expected_sign=+1, min_effect=0.05),
        Effect("RPS: last-iterate minus time-average exploitability at the end",
               paired(at_end(numbers, "rps", "average"), at_end(numbers, "rps", "last")),
               expected_sign=+1, min_effect=0.05),
        Effect("policy change per iteration (TV, last half): RPS - transitive game",
               paired(games["transitive"]["cycling"], games["rps"]["cycling"]),
               expected_sign=+1, primary=False, min_effect=0.05),
    ]
    rows = [[LABELS[name], cell(at_end(numbers, name, "last"), 4),
             cell(at_end(numbers, name, "average"), 4), cell(games[name]["cycling"], 4),
             cell([float(c) for c in games[name]["argmax_changes"]], 1)]
            for name in games]
    table = Table(["game", "last-iterate exploitability (end)",
                   "time-average exploitability (end)",
                   "policy change per iteration (TV, last half)",
                   "argmax changes (last half)"], rows)
    s = numbers["settings"]
    notes = [f"{s['iterations']} iterations from random logits: search policy "
             f"softmax(A pi / {s['temperature']:g}), then {s['distill_steps']} gradient steps "
             f"(lr {s['learning_rate']:g}) of cross-entropy towards it; exploitability "
             "max_a (A pi)_a, 0 at the equilibrium.",
             "At RPS's uniform equilibrium the linearised loop multiplies the distance to it by "
             f"{numbers['equilibrium_growth']:.2f} per iteration (above 1: it repels), so the "
             "last iterate circles R -> P -> S while the average closes in on the equilibrium."]
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    x = numbers["iterations"]
    for ax, (name, game) in zip(axes[:2], numbers["games"].items(), strict=True):
        band(ax, x, game["last"], "last iterate")
        band(ax, x, game["average"], "time average")
        ax.set_yscale("log")
        ax.set(xlabel="iteration", ylabel="exploitability max_a (A pi)_a",
               title=f"{LABELS[name]} (mean ± SE)")
    rps = numbers["games"]["rps"]
    trajectory = np.array(rps["trajectory"][0])
    for i, action in enumerate(rps["actions"]):
        axes[2].plot(range(len(trajectory)), trajectory[:, i], marker=".", label=action)
    axes[2].set(xlabel="iteration", ylabel="probability",
                title=f"rock-paper-scissors policy, seed {numbers['seeds'][0]}")
    tidy(*axes)
    fig.suptitle("the same self-play loop: settles on a transitive game, cycles on RPS")
    return save_figure(fig, out)


# minutes: measured 0.22 s per seed at the full budget (5000 iterations of both games, numpy)
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=0.004,
                        needs_base=False)
