"""What an experiment is: a claim, the arms it trains, how it measures them, what the
numbers say, and its figure. Each experiment module defines one `Experiment`.

The steps are separate so that each is small and the analysis is a pure function of saved
numbers: `measure` returns a JSON-serialisable dict (saved as measurements.json), `analyse`
turns it into effects and a table (unit-testable on synthetic numbers), `plot` draws it.
"""

from __future__ import annotations

from collections.abc import Callable
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
    arms: Callable[[str], list[Arm | SFTArm] | list[ZeroArm]]  # by scale name (quick | full)
    measure: Callable[[Context, dict[str, list[Any]]], Numbers]  # Trained(SFT|Zero)Arm
    analyse: Callable[[Numbers], Analysis]
    plot: Callable[[Numbers, Path], Path]
    settings: dict[str, Any]    # by scale name: the experiment's own budget (a dataclass)
    minutes: float              # the full budget's estimated wall time on 2 cores, base excluded
    needs_base: bool = True     # RLVR arms start from the SFT base; Zero arms need none
