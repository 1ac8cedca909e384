"""`rlscale zero ...`: the AlphaZero loop's commands. Training's are here; the arena's, which
load a trained model to measure or play it, are in arena.py and play.py (ARENA_COMMANDS)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..config import load_config
from ..runtime.errors import interrupted, run_guarded
from . import arena, play

app = typer.Typer(
    help="AlphaZero-style self-play: train a policy-value network with batched MCTS.",
    no_args_is_help=True,
)


@app.callback()
def _zero() -> None:
    """AlphaZero-style self-play (Zero)."""


@app.command()
def train(
    config: Annotated[Path, typer.Argument(help="YAML config, e.g. configs/zero/tictactoe.yaml")],
    overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted overrides: train.lr=1e-3")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="run directory (default runs/zero/<name>)")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="continue from the last checkpoint")] = False,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="replace the earlier run there (only rlscale's files)")] = False,
    allow_config_change: Annotated[bool, typer.Option(
        "--allow-config-change",
        help="--resume with a config that changes the math; recorded in config_changes.jsonl")
    ] = False,
    progress: Annotated[bool, typer.Option(
        "--progress/--no-progress", help="show a progress bar")] = True,
    resume_from: Annotated[Path | None, typer.Option(
        "--resume-from",
        help="continue another run's checkpoint (or `zero export-state` folder) in this new run "
             "directory: weights, optimiser, counters; the replay refills")] = None,
) -> None:
    """Self-play, learn, checkpoint; `--resume` continues exactly where a run stopped."""
    from ..runtime.trackers import check_trackers
    from ..zero.config import ZeroConfig
    from ..zero.loop import train as run_training

    command = ["rlscale", "zero", "train", str(config), *(overrides or [])]
    if out is not None:
        command += ["--out", str(out)]

    def go():
        cfg = None
        try:
            cfg = load_config(ZeroConfig, config, overrides or [])
            check_trackers(cfg.logging)  # before the run directory is touched
            if out is not None:
                cfg.out = str(out)
            return run_training(cfg, resume=resume, progress=progress, overwrite=overwrite,
                                allow_config_change=allow_config_change, resume_from=resume_from,
                                resume_needs_run=True)
        except KeyboardInterrupt:
            interrupted(None if cfg is None else cfg.run_dir(), command)

    result = run_guarded(go)
    c = result.counters
    typer.echo(
        f"done: {c.iteration} iterations, {c.games} games, {c.learner_steps} learner steps, "
        f"{c.seconds / 60:.1f} min; model in {result.final_dir}"
    )


@app.command("export-state")
def export_state(
    run: Annotated[Path, typer.Argument(
        help="a run directory (its newest checkpoint) or a checkpoint")],
    out: Annotated[Path, typer.Option("--out", help="a new folder")],
) -> None:
    """Copy a run's training state without its replay (a few MB: commit it, then continue
    with `zero train CONFIG --out NEW --resume-from OUT`); also a playable model folder."""
    from ..zero.training_state import export_training_state

    path = run_guarded(export_training_state, run, out)
    typer.echo(f"training state written to {path}")


# The commands that load a trained model to measure or play it, one function each, by name.
ARENA_COMMANDS = {
    "arena": arena.arena, "compute-curve": arena.compute_curve,
    "solver-agreement": arena.solver_agreement, "play": play.play, "move": play.move,
    "gtp": play.gtp, "elo-curve": arena.elo_curve,
}
for _name, _command in ARENA_COMMANDS.items():
    app.command(_name)(_command)
