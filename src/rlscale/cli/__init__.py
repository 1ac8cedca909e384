"""The `rlscale` command: parse arguments, build a config, call one run function.

The top layer: every command lives in this package (rlvr.py, zero.py with arena.py,
experiments.py, simulate.py), and nothing else in rlscale imports it."""

from __future__ import annotations

from typing import Annotated

import typer

from . import experiments, model, rlvr, simulate, zero
from .common import CommandList

# Help in click's plain layout (every sub-app inherits the markup mode): typer's rich panels
# print `<bool>` beside every flag and cut long option names at 80 columns; the plain one
# keeps each name whole and grows to 120 columns in a wider terminal.
app = typer.Typer(help="rlscale: RLVR for language models and AlphaZero-style self-play.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  rich_markup_mode=None, context_settings={"max_content_width": 120},
                  cls=CommandList)
for _name, _command in rlvr.TOP_LEVEL.items():
    app.command(_name)(_command)
app.add_typer(rlvr.app, name="rlvr", cls=CommandList)
app.add_typer(experiments.app, name="experiments", cls=CommandList)
app.add_typer(simulate.app, name="fleet", cls=CommandList)
app.add_typer(zero.app, name="zero", cls=CommandList)
app.add_typer(model.app, name="model", cls=CommandList)

def installed_version() -> str:
    """The installed distribution's version (its metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlscale")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"rlscale {installed_version()}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="print the version and exit")] = False) -> None:
    pass


def main() -> None:  # pragma: no cover
    app()
