"""One error guard for every command: a mistake is one `error: ...` line, not a traceback.

- A usage error (a bad config, flag, path, model or move: every error rlscale raises for
  one is a ValueError, beside the file errors) exits with status 2.
- A run that failed by itself (it diverged, or its fleet could not go on) exits with
  status 1; a fleet that cannot start (FleetUnavailable) is a ValueError, a usage error.
- Ctrl-C in a training run says where the run stopped and how to continue: status 130, as
  shells expect. SIGTERM (what schedulers and `timeout` send) takes the same path: it is
  raised as `Terminated`, a KeyboardInterrupt, so the run unwinds the same way (its lock
  removed, the same message) and exits with status 143.

RLSCALE_DEBUG=1 lets the exception through, with the traceback the one line summarises.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer

USAGE_STATUS, FAILURE_STATUS, INTERRUPTED_STATUS = 2, 1, 130
TERMINATED_STATUS = 128 + signal.SIGTERM  # 143: what a shell reports for a SIGTERM'd command
USAGE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, FileExistsError, FileNotFoundError, NotADirectoryError)

T = TypeVar("T")


def _run_failures() -> tuple[type[BaseException], ...]:
    # imported only when something failed: health pulls in torch
    from .fleet import FleetError
    from .health import NonFiniteError

    return (NonFiniteError, FleetError)


def first_line(exc: BaseException) -> str:
    """The first line of the exception's message, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def fail(message: str, status: int = USAGE_STATUS) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(status)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt: every `except
    KeyboardInterrupt` and `finally` on the way out runs for it too."""


def _raise_terminated(signum: int, frame: Any) -> None:
    # One-shot: a second SIGTERM while the run unwinds ends the process at once, as a
    # scheduler that escalates expects, instead of interrupting the clean-up with a traceback.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[bool]:
    """SIGTERM raises `Terminated` in the main thread while the block runs; yields whether
    this call installed the handler (False: not the main thread, or an outer block did)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is _raise_terminated:
        yield False
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_guarded(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`; a usage error or a failed run becomes one line on stderr and
    its exit status. SIGTERM unwinds it like Ctrl-C (status 143 when nothing catches it)."""
    with sigterm_as_interrupt() as outermost:
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
        except Terminated:
            if not outermost:  # the command's own `except KeyboardInterrupt` may be outside
                raise
            raise typer.Exit(TERMINATED_STATUS) from None


def guarded(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` under `run_guarded`, with its signature kept (typer reads the options from it)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        return run_guarded(fn, *args, **kwargs)

    return wrapper


def interrupted(run_dir: str | Path | None, command: Sequence[str]) -> NoReturn:
    """Ctrl-C or SIGTERM (call it in `except KeyboardInterrupt`): where the run in `run_dir`
    stopped and the command that continues it (nothing to say when the run had not started,
    `run_dir` None); exit status 130, or 143 for SIGTERM."""
    if run_dir is not None:
        from .rundir import resume_hint

        typer.echo(resume_hint(run_dir, list(command)), err=True)
    status = TERMINATED_STATUS if isinstance(sys.exc_info()[1], Terminated) else INTERRUPTED_STATUS
    raise typer.Exit(status) from None
