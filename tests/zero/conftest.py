import pytest
import typer
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def cli():
    """The arena commands (`rlscale zero arena`, `move`, `elo-curve`, ...) on a fresh app:
    call it with the argument list (and optional stdin) to get typer's result."""
    from rlscale.cli.zero import ARENA_COMMANDS

    app = typer.Typer()

    @app.callback()
    def _zero() -> None:
        """Zero."""

    for name, command in ARENA_COMMANDS.items():
        app.command(name)(command)
    runner = CliRunner()
    return lambda args, input=None: runner.invoke(app, args, input=input)
