"""`rlscale experiments report`: docs/experiments.md from the saved results.

Per experiment: the claim, the set-up, the verdict with its effects, the figure (copied next
to the report, so the markdown links stay relative), the table, the notes and the command
that reproduces it. An experiment without a saved result is listed with its command.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from .record import ExperimentResult, Table, load_result
from .registry import EXPERIMENTS
from .runner import uses_shared_base
from .setup import FULL, QUICK, SFTArm
from .spec import Experiment
from .verdict import ALPHA, POWER, Effect, could_show, describe, power_statement

SEED_KEYS = ("train.seed=", "seed=", "data.seed=")  # what differs between an arm's seeds
# The report before verdicts had a stated error rate and every section a saved result.
PREVIOUS_REPORT = Path("docs/history/experiments-2026-12-03.md")

HEADER = """# The field's claims, measured

Each section is one `rlscale experiments` experiment on the reasoning task
([reasoning.md](reasoning.md)), or for the Zero ones (`zero_*`, `grpo_vs_zero*`,
`selfplay_cycles`) on tic-tac-toe, Connect Four or small matrix games, whose exact solutions
judge a network: a claim from the
literature, the runs that test it (the library's own configs and training loops), a figure,
and a verdict computed from the numbers. Every section is generated from a saved result
(docs/experiments/NAME.json); an experiment without one has no verdict here.

How a verdict is reached: every effect is measured once per seed (a paired difference, e.g.
arm B minus arm A trained with the same seed); its estimate is the mean over the n seeds and
its {confidence:.0%} interval `mean ± t SE`, with Student's t at n - 1 degrees of freedom. An
effect *supports* the claim when the interval excludes 0 on the predicted side and the mean
is at least the effect's stated minimum (`min`, the smallest size that matters, fixed before
the run), *contradicts* it when the same holds for the opposite sign, and is *inconclusive*
otherwise; one seed is always inconclusive. Under no effect, a false call (either way) has
probability <= {alpha:.0%} per effect (tests/test_experiments.py measures it by simulation). A
claim is contradicted by any primary effect that contradicts it, supported only when all its
primary effects support it. An effect the claim says is *at most* a margin (e.g. "RL does
not raise pass@k at large k") is a non-superiority test: supported when its one-sided 95%
upper bound is below the margin (`min`), contradicted when it is clearly above it.

**Power**: *detects* is the smallest true effect whose interval would exclude 0 with
probability {power:.0%} at the observed spread, `(t_(1-alpha/2) + t_power) SE`. A set-up
*could show* an effect when that is at most the effect's `min`; where it could not, an
inconclusive verdict is no evidence that the effect is absent.

```bash
rlscale experiments list                    # the experiments and their claims
rlscale experiments run NAME                # full budget, {seeds} seeds
rlscale experiments run NAME --quick        # CI-sized smoke run, 1 seed
rlscale experiments run NAME --jobs 4       # 4 (arm, seed) runs (and Zero matches) at once, cores / 4 threads each
rlscale experiments run all --base runs/reasoning/base   # reuse the reasoning quickstart's base
rlscale experiments report                  # this file, from runs/experiments/*/result.json
```

The same command continues a stopped run: finished arm runs are reused, a killed one resumes
from its last checkpoint, and measurements kept as they came back (go_switches' matches, under
`runs/experiments/NAME/judged/`) are loaded; `--overwrite` trains and judges again.
"""


def _wall_time(result: ExperimentResult) -> str:
    """The run's minutes; a rerun that reused finished arm runs says so, since its minutes
    are not the experiment's cost."""
    minutes = f"{result.seconds / 60:.1f} min"
    if not result.reused_runs:
        return minutes
    return (f"{minutes} for the run that wrote this, which reused {result.reused_runs} of "
            f"{len(result.arms)} arm runs trained before")


def predicted(effect: Effect) -> str:
    """What the claim predicts of an effect: a sign, or (at most) a ceiling."""
    if effect.test == "at_most":
        return f"at most {effect.min_effect:g}"
    return "+" if effect.expected_sign > 0 else "-"


def _effects_table(result: ExperimentResult) -> str:
    rows = [[e.name, ", ".join(f"{v:+.4g}" for v in e.per_seed), describe(e),
             predicted(e), f"{e.min_effect:g}", power_statement(e),
             "primary" if e.primary else "reported",
             f"**{e.verdict}**" if e.primary else e.verdict]
            for e in result.analysis.effects]
    return Table(["effect", "per seed", f"estimate [{1 - ALPHA:.0%} interval]", "predicted sign",
                  "min", "power", "role", "verdict"], rows).markdown()


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


def _base_minutes(experiment: Experiment) -> str:
    """What the bases an experiment's full arms start from cost on first use: the shared
    SFT base (~7 min) and/or bases of their own (~8 min each)."""
    if not experiment.needs_base:
        return ""
    arms = experiment.arms("full")
    own = sorted({arm.base.name for arm in arms if getattr(arm, "base", None) is not None})
    costs = []
    if uses_shared_base(experiment, arms):
        costs.append("~7 min for the shared SFT base")
    if own:
        costs.append(f"~{8 * len(own)} min for its own SFT base{'s' if len(own) > 1 else ''} "
                     f"({', '.join(own)})")
    return ", plus " + " and ".join(costs) + " on first use"


def _budget(experiment: Experiment) -> str:
    def settings(scale: str) -> str:
        return ", ".join(f"{k} {v}" for k, v in asdict(experiment.settings[scale]).items())

    base = _base_minutes(experiment)
    smaller = "a smaller task and base" if experiment.needs_base else "a smaller self-play budget"
    minutes = experiment.minutes_per_seed * FULL.seeds
    return (f"**Budget.** Full: {settings('full')}, {FULL.seeds} seeds (estimated "
            f"~{minutes:g} min on 2 cores{base}). Quick: {settings('quick')}, "
            f"{QUICK.seeds} seed, on {smaller} (`--quick`).")


def section(name: str, result: ExperimentResult | None, figure: str | None) -> str:
    experiment = EXPERIMENTS[name]
    parts = [f"## {name}", f"**Claim.** {experiment.claim}", f"**Set-up.** {experiment.setup}",
             _budget(experiment)]
    if result is None:
        parts.append(f"No saved result, so no verdict: run\n\n```bash\nrlscale experiments run "
                     f"{name}\nrlscale experiments report\n```")
        return "\n\n".join(parts)
    if result.budget == "quick":
        parts.append("> Quick budget: a smoke run sized for CI. Its numbers show that the "
                     "pipeline runs, not whether the claim holds.")
    shown = ("its set-up could show every primary effect of its stated minimum"
             if could_show(result.analysis.effects) else
             "its set-up could not show every primary effect of its stated minimum (see power)")
    parts.append(f"**Verdict: {result.verdict}** ({_seeds(result)}, {result.budget} budget, "
                 f"{_wall_time(result)}, {result.date}); {shown}."
                 + (f" Machine: {result.machine}" if result.machine else "")
                 + (f"; compute dtype {result.compute_dtype}" if result.machine
                    and result.compute_dtype else "") + ("." if result.machine else ""))
    parts.append(_effects_table(result))
    if figure is not None:
        parts.append(f"![{name}]({figure})")
    parts.append(result.analysis.table.markdown())
    parts += result.analysis.notes
    parts.append(_arms(result, experiment))
    parts.append(f"```bash\n{result.command}\n```")
    return "\n\n".join(parts)


def _seeds(result: ExperimentResult) -> str:
    return f"{len(result.seeds)} seed{'s' if len(result.seeds) != 1 else ''}"


def _summary_row(name: str, result: ExperimentResult | None) -> list[str]:
    """One row of the summary table: verdict, seeds, each primary effect with its interval,
    and whether the set-up could show it."""
    link = f"[{name}](#{name})"
    if result is None:
        return [link, "no saved result", "", "", ""]
    primaries = [e for e in result.analysis.effects if e.primary]
    effects = "; ".join(f"{e.name}: {describe(e).rsplit(' (', 1)[0]}" for e in primaries)
    power = "; ".join(power_statement(e) for e in primaries)
    return [link, f"**{result.verdict}** ({result.budget})", str(len(result.seeds)), effects,
            power]


@dataclass(frozen=True)
class PreviousVerdict:
    """An experiment's entry in an older report: its summary verdict, set-up and date."""

    verdict: str
    setup: str
    date: str


def previous_verdicts(path: Path) -> dict[str, PreviousVerdict]:
    """The entries of an older report's summary table and sections, by experiment, for the
    list of verdicts that changed (empty when there is no such report)."""
    if not Path(path).is_file():
        return {}
    text = Path(path).read_text()
    found = {}
    for name in EXPERIMENTS:
        row = next((line for line in text.splitlines()
                    if line.startswith(f"| [{name}](#{name}) |")), None)
        if row is None:
            continue
        chunk = text.split(f"\n## {name}\n", 1)
        body = chunk[1].split("\n## ", 1)[0] if len(chunk) == 2 else ""
        setup = body.split("**Set-up.** ", 1)[1].split("\n", 1)[0] if "**Set-up.** " in body else ""
        verdict_line = body.split("**Verdict:", 1)[1].split("\n", 1)[0] if "**Verdict:" in body else ""
        date = re.search(r"\d{4}-\d{2}-\d{2}", verdict_line)
        found[name] = PreviousVerdict(row.rstrip(" |").rsplit(" | ", 1)[1], setup,
                                      date.group(0) if date else "")
    return found


def _changes(results: dict[str, ExperimentResult | None], previous: Path,
             experiments: dict[str, Experiment]) -> str:
    """The experiments whose verdict differs from the report at `previous`, with the reasons
    the records show: the rule, the seeds, the set-up, or no saved result at all."""
    rows = []
    for name, entry in previous_verdicts(previous).items():
        before, result = entry.verdict, results.get(name)
        now = "no saved result" if result is None else (
            f"{result.verdict} ({result.budget}, {_seeds(result)})")
        if now == before:
            continue
        if result is None:
            reasons = ["the older verdict had no saved result behind it (carried from an "
                       "older report); not run again"]
        else:
            reasons = [f"verdict rule: a {1 - ALPHA:.0%} t interval with n - 1 df and a stated "
                       "minimum (was 2 standard errors)"]
            old_seeds = before.rsplit(", ", 1)[-1].rstrip(")")
            if old_seeds != _seeds(result):
                reasons.append(f"{old_seeds} -> {_seeds(result)}")
            if entry.setup and entry.setup != experiments[name].setup:
                reasons.append("set-up redesigned")
            if entry.date and result.date != entry.date:
                reasons.append(f"measured again ({result.date}; was {entry.date})")
        rows.append([f"[{name}](#{name})", before, now, "; ".join(reasons)])
    if not rows:
        return ""
    table = Table(["experiment", "previous report", "now", "why"], rows).markdown()
    return (f"### Verdicts changed since [the previous report]({_relative(previous)})\n\n"
            + table)


def _relative(path: Path) -> str:
    parts = Path(path).parts
    return "/".join(parts[1:]) if parts and parts[0] == "docs" else str(path)


def _load(name: str, runs: Path, figures: Path) -> tuple[ExperimentResult | None, str | None]:
    """An experiment's result from `runs` (its result and figure copied to `figures`), or
    the one saved in `figures` before; (None, None) when neither exists."""
    result = load_result(Path(runs) / name)
    if result is not None:
        figures.mkdir(parents=True, exist_ok=True)
        (figures / f"{name}.json").write_text(json.dumps(result.as_dict(), indent=1) + "\n")
        if (Path(runs) / name / result.figure).is_file():
            shutil.copyfile(Path(runs) / name / result.figure, figures / f"{name}.png")
    elif (figures / f"{name}.json").is_file():
        result = ExperimentResult.from_dict(json.loads((figures / f"{name}.json").read_text()))
    else:
        return None, None
    figure = f"{figures.name}/{name}.png" if (figures / f"{name}.png").is_file() else None
    return result, figure


def write_report(runs: Path = Path("runs/experiments"),
                 out: Path = Path("docs/experiments.md"),
                 previous: Path = PREVIOUS_REPORT) -> Path:
    """docs/experiments.md (or `out`) from the saved results only: those under `runs`
    (copied to `out`'s folder under experiments/ as NAME.json and NAME.png) and those saved
    there before. An experiment with neither gets a section without a verdict: nothing is
    carried forward from an older report. Verdicts that differ from the report at
    `previous` are listed with the reasons."""
    out = Path(out)
    figures = out.parent / "experiments"
    results, sections = {}, []
    for name in EXPERIMENTS:
        results[name], figure = _load(name, runs, figures)
        sections.append(section(name, results[name], figure))
    summary = Table(["experiment", "verdict", "seeds",
                     f"primary effects [{1 - ALPHA:.0%} interval]", "power"],
                    [_summary_row(name, results[name]) for name in EXPERIMENTS]).markdown()
    changes = _changes(results, previous, EXPERIMENTS)
    head = HEADER.format(confidence=1 - ALPHA, alpha=ALPHA, power=POWER, seeds=FULL.seeds)
    text = "\n\n".join(part for part in [head.rstrip(), summary, changes, *sections] if part)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    return out
