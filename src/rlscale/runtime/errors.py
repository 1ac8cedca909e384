"""One error guard for every command: a mistake is one `error: ...` line, not a traceback.

- A usage error (a bad config, flag, path, model or move: every error rlscale raises for
  one is a ValueError, beside the file errors) exits with status 2.
- A run that failed by itself (it diverged, or its fleet could not go on) exits with
  status 1; a fleet that cannot start (FleetUnavailable) is a ValueError, a usage error.
- Ctrl-C in a training run says where the run stopped and how to continue: status 130, as
  shells expect.

RLSCALE_DEBUG=1 lets the exception through, with the traceback the one line summarises.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer

USAGE_STATUS, FAILURE_STATUS, INTERRUPTED_STATUS = 2, 1, 130
USAGE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, FileExistsError, FileNotFoundError, NotADirectoryError)

T = TypeVar("T")


def _run_failures() -> tuple[type[BaseException], ...]:
    # imported only when something failed: health pulls in torch
    from rlscale.runtime.fleet import FleetError
    from rlscale.runtime.health import NonFiniteError

    return (NonFiniteError, FleetError)


def first_line(exc: BaseException) -> str:
    """The first line of the exception's message, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def fail(message: str, status: int = USAGE_STATUS) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(status)


def run_guarded(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`; a usage error or a failed run becomes one line on stderr and
    its exit status."""
    try:
        return fn(*args, **kwargs)
    except USAGE_ERRORS as exc:
        if os.environ.get("RLSCALE_DEBUG"):
            raise
        fail(first_line(exc), USAGE_STATUS)
    except _run_failures() as exc:
        if os.environ.get("RLSCALE_DEBUG"):
            raise
        fail(first_line(exc), FAILURE_STATUS)


def guarded(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` under `run_guarded`, with its signature kept (typer reads the options from it)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        return run_guarded(fn, *args, **kwargs)

    return wrapper


def interrupted(run_dir: str | Path | None, command: Sequence[str]) -> NoReturn:
    """Ctrl-C: where the run in `run_dir` stopped and the command that continues it (nothing
    to say when the run had not started, `run_dir` None); exit status 130."""
    if run_dir is not None:
        from rlscale.runtime.rundir import resume_hint

        typer.echo(resume_hint(run_dir, list(command)), err=True)
    raise typer.Exit(INTERRUPTED_STATUS) from None
