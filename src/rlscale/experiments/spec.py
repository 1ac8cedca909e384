"""What an experiment is: a claim, the arms it trains, how it measures them, what the
numbers say, and its figure. Each experiment module declares one `Experiment`; the runner
(runner.py) runs every one the same way.

The steps are separate so that each is small and the analysis is a pure function of saved
numbers: `measure` returns a JSON-serialisable dict (saved as measurements.json), `analyse`
turns it into effects and a table (unit-testable on synthetic numbers), `plot` draws it.

The budgets and arm builders here are the shapes most experiments share: GRPO arms that
differ by a few overrides and are judged on held-out prompts, and Zero arms of one config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .record import Analysis
from .setup import Arm, Context, SFTArm, ZeroArm

Numbers = dict[str, Any]


@dataclass(frozen=True)
class Experiment:
    name: str
    claim: str                  # one sentence
    setup: str                  # what is compared, on what, in a few sentences
    settings: dict[str, Any]    # by scale name: the experiment's own budget (a dataclass)
    arms: Callable[[str], list[Arm | SFTArm] | list[ZeroArm]]  # by scale name (quick | full)
    measure: Callable[[Context, dict[str, list[Any]]], Numbers]  # Trained(SFT|Zero)Arm
    analyse: Callable[[Numbers], Analysis]
    plot: Callable[[Numbers, Path], Path]
    minutes_per_seed: float     # the full budget's estimated wall time per seed on 2 cores, base excluded
    needs_base: bool = True     # RLVR arms start from the SFT base; Zero arms need none


@dataclass(frozen=True)
class HeldOutBudget:
    """GRPO steps per arm, then held-out pass@1 of the final models."""

    steps: int
    prompts: int     # held-out prompts per model
    samples: int     # per prompt


@dataclass(frozen=True)
class CurveBudget(HeldOutBudget):
    """A `HeldOutBudget` whose training curves are also drawn, averaged over windows."""

    window: int      # steps per point of the training curves


@dataclass(frozen=True)
class ZeroBudget:
    """A Zero arm's training: iterations of its config, with the scale's overrides."""

    iterations: int
    overrides: tuple[str, ...]   # on the arm's config under configs/zero/, beside the iterations


# What a quick Zero arm trims from its config: a small search and small self-play batches.
QUICK_SELFPLAY = ("mcts.simulations=8", "selfplay.concurrent_games=16",
                  "selfplay.games_per_iteration=16", "train.min_replay=64", "train.batch_size=64")


def grpo_arms(steps: int, own: Mapping[str, tuple[str, ...]], *shared: str) -> list[Arm]:
    """One GRPO arm per label of `own`, each `steps` steps: the `shared` overrides, then its
    own (the order they appear in the arm's recipe)."""
    return [Arm(label, (f"train.steps={steps}", *shared, *overrides))
            for label, overrides in own.items()]


def zero_arms(config: str, budget: ZeroBudget,
              own: Mapping[str, tuple[str, ...]] | None = None) -> list[ZeroArm]:
    """One Zero arm per label of `own` (by default a single `alphazero`) on `config`: the
    budget's iterations and overrides, then the arm's own."""
    own = {"alphazero": ()} if own is None else own
    return [ZeroArm(label, config, (f"train.iterations={budget.iterations}", *budget.overrides,
                                    *overrides))
            for label, overrides in own.items()]
