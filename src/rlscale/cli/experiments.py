"""`rlscale experiments ...`. Light at import: the experiments, and torch with them, load when
a command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..runtime.errors import INTERRUPTED_STATUS, fail, run_guarded
from .common import prepare_command_process

app = typer.Typer(help="The field's claims as runnable experiments on the reasoning task.",
                  no_args_is_help=True)


@app.command("list")
def list_command() -> None:
    """Each experiment with its claim."""
    from ..experiments.registry import claims

    for name, claim in claims().items():
        typer.echo(f"{name}\n    {claim}")


@app.command("run")
def run_command(
    name: Annotated[str, typer.Argument(help="an experiment (rlscale experiments list), or all")],
    quick: Annotated[bool, typer.Option(
        help="CI-sized budget: a small base model, a few steps, one seed")] = False,
    seeds: Annotated[int | None, typer.Option(
        help="training seeds (default: 4 at full budget, 1 with --quick)")] = None,
    out: Annotated[Path | None, typer.Option(
        help="experiments folder; writes OUT/NAME and the shared base OUT/base (default "
             "runs/experiments, or runs/experiments-quick with --quick)")] = None,
    base: Annotated[Path | None, typer.Option(
        help="an existing SFT base model of the same task (e.g. runs/reasoning/base at full "
             "budget) instead of building OUT/base")] = None,
    overwrite: Annotated[bool, typer.Option(
        help="retrain the arms instead of reusing finished ones (the base stays: delete "
             "OUT/base to rebuild it)")] = False,
    jobs: Annotated[int, typer.Option(
        help="(arm, seed) runs trained at once, each in a process of its own with cores / "
             "jobs threads unless OMP_NUM_THREADS is set; the same runs as one at a time; "
             "Zero experiments' per-seed matches and GRPO-at-budget runs too")] = 1,
) -> None:
    """Train the arms, measure, analyse, plot; the result lands in OUT/NAME/result.json."""
    from ..experiments.registry import EXPERIMENTS
    from ..experiments.runner import DEFAULT_OUT, get, run_experiment
    from ..experiments.verdict import describe

    root = out if out is not None else DEFAULT_OUT["quick" if quick else "full"]

    def go():
        names = list(EXPERIMENTS) if name == "all" else [get(name).name]
        for chosen in names:
            try:
                result = run_experiment(chosen, quick=quick, seeds=seeds, out=out, base=base,
                                        overwrite=overwrite, jobs=jobs)
            except KeyboardInterrupt:
                fail("interrupted; the same command continues: finished arms are reused, the "
                     "interrupted one resumes from its last checkpoint", INTERRUPTED_STATUS)
            typer.echo(f"\n{chosen}: {result.verdict} ({result.seconds:.0f}s)")
            for effect in result.analysis.effects:
                role = "primary" if effect.primary else "reported"
                typer.echo(f"  {effect.name}: {describe(effect)} -> {effect.verdict} ({role})")
            typer.echo(f"  figure and result: {root / chosen}")

    prepare_command_process()
    run_guarded(go)


@app.command("report")
def report_command(
    runs: Annotated[Path, typer.Option(help="the experiments folder to read")] = Path(
        "runs/experiments"),
    out: Annotated[Path, typer.Option(help="the markdown to write")] = Path("docs/experiments.md"),
) -> None:
    """Write docs/experiments.md: every experiment's claim, figure, table, verdict and command."""
    from ..experiments.report import write_report

    path = run_guarded(write_report, runs, out)
    typer.echo(f"report written to {path}")
