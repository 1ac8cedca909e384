"""`rlscale experiments report`: docs/experiments.md from the saved results.

Per experiment: the claim, the set-up, the verdict with its effects, the figure (copied next
to the report, so the markdown links stay relative), the table, the notes and the command
that reproduces it. An experiment without a saved result is listed with its command.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from .record import ExperimentResult, Table, load_result
from .registry import EXPERIMENTS
from .setup import FULL, QUICK, SFTArm
from .spec import Experiment
from .verdict import Z, describe

SEED_KEYS = ("train.seed=", "seed=", "data.seed=")  # what differs between an arm's seeds

HEADER = """# The field's claims, measured

Each section is one `rlscale experiments` experiment on the reasoning task
([reasoning.md](reasoning.md)), or for the Zero ones (`zero_*`, `grpo_vs_zero*`) on
tic-tac-toe or Connect Four, whose exact solutions judge a network: a claim from the
literature, the runs that test it (the library's own configs and training loops), a figure,
and a verdict computed from the numbers.

How a verdict is reached: every effect is measured once per seed (a paired difference, e.g.
arm B minus arm A trained with the same seed); its estimate is the mean over seeds with the
standard error sd/sqrt(n). An effect *supports* the claim when it has the predicted sign and
is at least {z:g} standard errors (and the effect's stated minimum) away from zero,
*contradicts* it when the same holds for the opposite sign, and is *inconclusive* otherwise;
one seed is always inconclusive. A claim is contradicted by any primary effect that
contradicts it, supported only when all its primary effects support it.

```bash
rlscale experiments list                    # the experiments and their claims
rlscale experiments run NAME                # full budget, 2 seeds (4-55 min each measured on 2 cores)
rlscale experiments run NAME --quick        # CI-sized smoke run, 1 seed
rlscale experiments run all --base runs/reasoning/base   # reuse the reasoning quickstart's base
rlscale experiments report                  # this file, from runs/experiments/*/result.json
```
"""


def _wall_time(result: ExperimentResult) -> str:
    """The run's minutes; a rerun that reused finished arm runs says so, since its minutes
    are not the experiment's cost."""
    minutes = f"{result.seconds / 60:.1f} min"
    if not result.reused_runs:
        return minutes
    return (f"{minutes} for the run that wrote this, which reused {result.reused_runs} of "
            f"{len(result.arms)} arm runs trained before")


def _effects_table(result: ExperimentResult) -> str:
    rows = [[e.name, ", ".join(f"{v:+.4g}" for v in e.per_seed), describe(e),
             "+" if e.expected_sign > 0 else "-", "primary" if e.primary else "reported",
             f"**{e.verdict}**" if e.primary else e.verdict]
            for e in result.analysis.effects]
    return Table(["effect", "per seed", "estimate", "predicted sign", "role", "verdict"],
                 rows).markdown()


def _arms(result: ExperimentResult, experiment: Experiment) -> str:
    if not result.arms:
        return ("No training runs of the loop: everything is measured from the base model "
                "(see the set-up).")
    seen: dict[str, list[str]] = {}
    for arm in result.arms:  # the seeds differ by their seed settings only
        seen.setdefault(arm.label, [o for o in arm.overrides if not o.startswith(SEED_KEYS)])
    lines = [f"{label}: {' '.join(overrides)}" for label, overrides in seen.items()]
    sft = [a.label for a in experiment.arms(result.budget) if isinstance(a, SFTArm)]
    if not experiment.needs_base:
        on = "the Zero config of the set-up, with `train.seed` the seed"
    elif sft:
        on = ("`configs/rlvr/reasoning.yaml` (" + ", ".join(sft) + ": on "
              "`configs/rlvr/reasoning_sft.yaml`, `seed` and `data.seed` the seed), with "
              "`model.path` the base and `train.seed` the seed")
    else:
        on = "`configs/rlvr/reasoning.yaml`, with `model.path` the base and `train.seed` the seed"
    return f"Arms (overrides on {on}):\n\n```\n" + "\n".join(lines) + "\n```"


def _budget(experiment: Experiment) -> str:
    def settings(scale: str) -> str:
        return ", ".join(f"{k} {v}" for k, v in asdict(experiment.settings[scale]).items())

    base = ", plus ~7 min for the shared SFT base on first use" if experiment.needs_base else ""
    smaller = "a smaller task and base" if experiment.needs_base else "a smaller self-play budget"
    return (f"**Budget.** Full: {settings('full')}, {FULL.seeds} seeds (estimated "
            f"~{experiment.minutes:g} min on 2 cores{base}). Quick: {settings('quick')}, "
            f"{QUICK.seeds} seed, on {smaller} (`--quick`).")


def section(name: str, result: ExperimentResult | None, figure: str | None) -> str:
    experiment = EXPERIMENTS[name]
    parts = [f"## {name}", f"**Claim.** {experiment.claim}", f"**Set-up.** {experiment.setup}",
             _budget(experiment)]
    if result is None:
        parts.append(f"Not measured yet:\n\n```bash\nrlscale experiments run {name}\n```")
        return "\n\n".join(parts)
    if result.budget == "quick":
        parts.append("> Quick budget: a smoke run sized for CI. Its numbers show that the "
                     "pipeline runs, not whether the claim holds.")
    parts.append(f"**Verdict: {result.verdict}** ({len(result.seeds)} seed"
                 f"{'s' if len(result.seeds) != 1 else ''}, {result.budget} budget, "
                 f"{_wall_time(result)}, {result.date})."
                 + (f" Machine: {result.machine}; compute dtype {result.compute_dtype}."
                    if result.machine else ""))
    parts.append(_effects_table(result))
    if figure is not None:
        parts.append(f"![{name}]({figure})")
    parts.append(result.analysis.table.markdown())
    parts += result.analysis.notes
    parts.append(_arms(result, experiment))
    parts.append(f"```bash\n{result.command}\n```")
    return "\n\n".join(parts)


def previous_report(out: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The sections and summary rows of a report already at `out`, by experiment name (none
    when there is no report): what a report keeps for an experiment whose result is neither
    in the runs folder nor saved beside the report, e.g. in a fresh clone."""
    if not Path(out).is_file():
        return {}, {}
    text = Path(out).read_text()
    sections = {}
    for chunk in text.split("\n## ")[1:]:
        name = chunk.split("\n", 1)[0].strip()
        if name in EXPERIMENTS and "Not measured yet" not in chunk:
            sections[name] = "## " + chunk.rstrip("\n")
    rows = {}
    for line in text.splitlines():
        for name in sections:
            if line.startswith(f"| [{name}](#{name}) |"):
                rows[name] = line
    return sections, rows


def write_report(runs: Path = Path("runs/experiments"),
                 out: Path = Path("docs/experiments.md")) -> Path:
    """docs/experiments.md (or `out`) from the results under `runs`; figures and results are
    copied to `out`'s folder under experiments/ (NAME.png, NAME.json), and read from there
    for an experiment `runs` has no result of. An experiment with neither keeps the section
    the report at `out` already had: a result measured elsewhere is never dropped."""
    out = Path(out)
    figures = out.parent / "experiments"
    kept_sections, kept_rows = previous_report(out)
    sections, summary = [], []
    for name, experiment in EXPERIMENTS.items():
        result = load_result(Path(runs) / name)
        figure = None
        if result is not None:
            figures.mkdir(parents=True, exist_ok=True)
            (figures / f"{name}.json").write_text(json.dumps(result.as_dict(), indent=1) + "\n")
            if (Path(runs) / name / result.figure).is_file():
                shutil.copyfile(Path(runs) / name / result.figure, figures / f"{name}.png")
                figure = f"experiments/{name}.png"
        elif (figures / f"{name}.json").is_file():
            result = ExperimentResult.from_dict(json.loads((figures / f"{name}.json").read_text()))
            figure = f"experiments/{name}.png" if (figures / f"{name}.png").is_file() else None
        if result is None and name in kept_sections:
            sections.append(kept_sections[name])
            summary.append(None)  # the old row, below
            continue
        sections.append(section(name, result, figure))
        verdict = "not measured" if result is None else (
            f"{result.verdict} ({result.budget}, {len(result.seeds)} seed"
            f"{'s' if len(result.seeds) != 1 else ''})")
        summary.append([f"[{name}](#{name})", experiment.claim, verdict])
    table = Table(["experiment", "claim", "verdict"], [r for r in summary if r is not None])
    lines = table.markdown().splitlines()
    rows = iter(lines[2:])
    body = [kept_rows.get(name, "") if row is None else next(rows)
            for name, row in zip(EXPERIMENTS, summary, strict=True)]
    text = "\n\n".join([HEADER.format(z=Z).rstrip(), "\n".join([*lines[:2], *body]),
                        *sections]) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out
