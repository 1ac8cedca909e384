"""`rlscale zero ...`: the AlphaZero loop's commands (mounted by rlscale.cli)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlscale.config import load_config
from rlscale.runtime.errors import interrupted, run_guarded

app = typer.Typer(
    help="AlphaZero-style self-play: train a policy-value network with batched MCTS.",
    no_args_is_help=True,
)


@app.callback()
def _zero() -> None:
    """AlphaZero-style self-play (Zero)."""


@app.command()
def train(
    config: Path = typer.Argument(..., help="YAML config, e.g. configs/zero/tictactoe.yaml"),
    overrides: list[str] | None = typer.Argument(None, help="dotted overrides: train.lr=1e-3"),
    out: Path | None = typer.Option(None, "--out", help="run directory (default runs/zero/<name>)"),
    resume: bool = typer.Option(False, "--resume", help="continue from the last checkpoint"),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="replace the earlier run there (only rlscale's files)"),
    allow_config_change: bool = typer.Option(
        False, "--allow-config-change",
        help="--resume with a config that changes the math; recorded in config_changes.jsonl"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
    resume_from: Path | None = typer.Option(
        None, "--resume-from",
        help="continue another run's checkpoint (or `zero export-state` folder) in this new run "
             "directory: weights, optimiser, counters; the replay refills"),
) -> None:
    """Self-play, learn, checkpoint; `--resume` continues exactly where a run stopped."""
    from rlscale.runtime.trackers import check_trackers
    from rlscale.zero.config import ZeroConfig
    from rlscale.zero.loop import train as run_training

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
    run: Path = typer.Argument(..., help="a run directory (its newest checkpoint) or a checkpoint"),
    out: Path = typer.Option(..., "--out", help="a new folder"),
) -> None:
    """Copy a run's training state without its replay (a few MB: commit it, then continue
    with `zero train CONFIG --out NEW --resume-from OUT`); also a playable model folder."""
    from rlscale.zero.loop import export_training_state

    path = run_guarded(export_training_state, run, out)
    typer.echo(f"training state written to {path}")


def _register_arena_commands() -> None:
    # arena | compute-curve | solver-agreement | play | move | gtp | elo-curve live in
    # arena_cli.py.
    from rlscale.zero.arena_cli import register

    register(app)


_register_arena_commands()
