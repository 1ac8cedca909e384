"""The saved result of one experiment run: `result.json` in its run directory, the record
`rlscale experiments report` reads back."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .verdict import Effect, Verdict, experiment_verdict

RESULT_NAME = "result.json"
MEASUREMENTS_NAME = "measurements.json"
FIGURE_NAME = "figure.png"


@dataclass(frozen=True)
class Table:
    """A small table of formatted cells, as the report prints it."""

    columns: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        def line(cells: list[str]) -> str:  # a | inside a cell (1/|y|) would split it
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        lines = [line(self.columns), "| " + " | ".join("---" for _ in self.columns) + " |"]
        lines += [line(row) for row in self.rows]
        return "\n".join(lines)


@dataclass(frozen=True)
class ArmRecord:
    """One training run of an experiment: its label, seed, the overrides on the reasoning
    config that made it, and its run directory (relative to the experiment's)."""

    label: str
    seed: int
    overrides: list[str]
    run_dir: str


@dataclass(frozen=True)
class Analysis:
    """What an experiment's numbers say: its effects, the table and notes (e.g. where two
    curves cross, or why the set-up could not show an effect)."""

    effects: list[Effect]
    table: Table
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExperimentResult:
    name: str
    claim: str
    setup: str
    budget: str                 # quick | full
    seeds: list[int]
    command: str                # the command that reproduces it, relative paths only
    arms: list[ArmRecord]
    analysis: Analysis
    figure: str                 # file name in the run directory
    seconds: float              # this invocation's wall time
    date: str
    machine: str = ""           # runtime.device.machine_summary(); "" in older results
    compute_dtype: str = ""     # the arms' resolved train.compute_dtype(s)
    reused_runs: int = 0        # arm runs found finished and reused, not trained, by it

    @property
    def verdict(self) -> Verdict:
        return experiment_verdict(self.analysis.effects)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["analysis"] = {"effects": [e.as_dict() for e in self.analysis.effects],
                            "table": asdict(self.analysis.table), "notes": self.analysis.notes}
        data["verdict"] = self.verdict
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ExperimentResult:
        a = data["analysis"]
        analysis = Analysis([Effect.from_dict(e) for e in a["effects"]], Table(**a["table"]),
                            list(a["notes"]))
        fields = {k: v for k, v in data.items() if k not in ("analysis", "arms", "verdict")}
        return cls(**fields, arms=[ArmRecord(**arm) for arm in data["arms"]], analysis=analysis)


def save_result(result: ExperimentResult, run_dir: Path) -> Path:
    path = run_dir / RESULT_NAME
    path.write_text(json.dumps(result.as_dict(), indent=1) + "\n")
    return path


def load_result(run_dir: Path) -> ExperimentResult | None:
    path = run_dir / RESULT_NAME
    if not path.is_file():
        return None
    return ExperimentResult.from_dict(json.loads(path.read_text()))
