"""`rlscale zero ...`: the AlphaZero loop's commands (mounted by rlscale.cli)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlscale.config import ConfigError, load_config

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
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Self-play, learn, checkpoint; `--resume` continues exactly where a run stopped."""
    from rlscale.zero.config import ZeroConfig
    from rlscale.zero.loop import train as run_training

    try:
        cfg = load_config(ZeroConfig, config, overrides or [])
        if out is not None:
            cfg.out = str(out)
    except ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        result = run_training(cfg, resume=resume, progress=progress)
    except (FileExistsError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    c = result.counters
    typer.echo(
        f"done: {c.iteration} iterations, {c.games} games, {c.learner_steps} learner steps, "
        f"{c.seconds / 60:.1f} min; model in {result.final_dir}"
    )


def _register_arena_commands() -> None:
    # arena | compute-curve | solver-agreement | play | move | gtp live in arena_cli.py.
    from rlscale.zero.arena_cli import register

    register(app)


_register_arena_commands()
