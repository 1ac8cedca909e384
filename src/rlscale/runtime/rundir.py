"""The run-directory contract: a run directory belongs to one run, and nothing is lost.

- A fresh run writes only into a new or empty folder. A folder that holds an earlier run is
  continued only with `--resume` and replaced only with `--overwrite` (which deletes rlscale's
  own entries and nothing else). A folder that holds anything rlscale did not write is refused,
  whatever the flags: rlscale never deletes a user's files.
- An advisory lock file (`.lock`, the owner's host and PID) refuses a second concurrent run; a
  lock left by a dead process is taken over with a warning.
- A resume compares the new config with the recorded one: changes that alter the math are
  refused with the list of differences unless allowed, and every change is recorded in
  `config_changes.jsonl` with the step it took effect.

This module knows nothing of language models or games: each loop passes its config and
says which fields are free to change (speed, logging) and which field plans the run's length.
"""

from __future__ import annotations

import atexit
import errno
import fnmatch
import json
import os
import shutil
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config import StrictModel, config_to_dict

LOCK_NAME = ".lock"
CHANGES_NAME = "config_changes.jsonl"
# What rlscale writes at the top of a run directory (checkpoint.py, metrics.py, the loops;
# wandb/ and trackio/ are the experiment trackers' folders, trackers.py).
RUN_ENTRIES = frozenset({"config.yaml", "metrics.jsonl", "tb", "checkpoints", "final",
                         "wandb", "trackio", CHANGES_NAME, LOCK_NAME})
# A model folder rlscale wrote carries this file, so `--overwrite` can tell it from a user's.
MODEL_MARKER = ".rlscale-model"


class RunDirError(ValueError):
    """A run or output directory that cannot be used as asked; one line naming why."""


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _leftover(name: str) -> bool:
    # atomic_dir's temporaries and half-replaced copies of a killed process
    return name.startswith(".tmp-") or name.startswith(".old-")


def _sample(names: Iterable[str], limit: int = 3) -> str:
    names = sorted(names)
    shown = ", ".join(repr(n[:60]) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass(frozen=True)
class RunDirContents:
    ours: frozenset[str]      # entries rlscale writes in a run directory
    foreign: frozenset[str]   # everything else (never touched)
    progressed: bool = False  # a checkpoint, a metrics line or a model: the run did work

    @property
    def started(self) -> bool:
        return bool(self.ours - {LOCK_NAME})


def inspect_run_dir(run_dir: Path, extra_entries: Iterable[str] = ()) -> RunDirContents:
    known = RUN_ENTRIES | set(extra_entries)
    names = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    names = {n for n in names if not _leftover(n)}
    ours = frozenset(names & known)
    return RunDirContents(ours, frozenset(names - known), _progressed(run_dir, ours))


def _progressed(run_dir: Path, ours: frozenset[str]) -> bool:
    """Whether the run in `run_dir` completed any work: a final model or another model entry
    of the loop's (e.g. SFT's output), a checkpoint, or a line of metrics."""
    if ours - (RUN_ENTRIES - {"final"}):
        return True
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir() and any(not _leftover(p.name) for p in checkpoints.iterdir()):
        return True
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and metrics.stat().st_size > 0


def _make_dir(path: Path, what: str) -> None:
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{what} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".tmp-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise RunDirError(f"cannot write to {what} {path}: {exc.strerror or exc}") from None


def clean_leftovers(run_dir: Path) -> list[Path]:
    """Remove `.tmp-*` / `.old-*` folders of killed processes (call only while holding the
    lock: then no live process is writing them)."""
    removed = []
    for folder in (run_dir, run_dir / "checkpoints"):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if _leftover(p.name) and not p.name.startswith(f".tmp-probe-{os.getpid()}"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                removed.append(p)
    return removed


# -- the lock -----------------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM  # exists, owned by someone else
    return True


def lock_owner(path: Path) -> tuple[str, int]:
    """The `host pid` a lock file holds; ("", -1) when it is missing, unreadable or torn
    (written by a process killed mid-write)."""
    try:
        host, _, pid_text = path.read_text().strip().partition(" ")
        return host, int(pid_text)
    except (OSError, ValueError):
        return "", -1


def run_in_flight(run_dir: Path) -> bool:
    """Whether a live process on this host holds `run_dir`'s lock: a run is going on there
    (a stale lock, a killed run's, is not one)."""
    host, pid = lock_owner(run_dir / LOCK_NAME)
    return host == socket.gethostname() and pid > 0 and _pid_alive(pid)


class RunLock:
    """`.lock` in the run directory, holding `host pid` of the run that owns it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held = False

    def acquire(self) -> RunLock:
        me = f"{socket.gethostname()} {os.getpid()}"
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                f.write(me + "\n")
            self.held = True
            atexit.register(self.release)
            return self
        raise RunDirError(f"cannot take the lock {self.path}")

    def _take_over_if_stale(self) -> None:
        host, pid = lock_owner(self.path)
        here = host == socket.gethostname()
        if pid > 0 and (not here or _pid_alive(pid)) and pid != os.getpid():
            where = f"pid {pid}" + ("" if here else f" on {host}")
            raise RunDirError(f"{self.path.parent} is in use by another run ({where}); wait for "
                              f"it to finish, or delete {self.path} if that run is dead")
        _warn(f"taking over the stale lock {self.path} (pid {pid} is not running)")
        self.path.unlink(missing_ok=True)

    def release(self) -> None:
        if self.held:
            self.held = False
            self.path.unlink(missing_ok=True)


# -- preparing a directory ----------------------------------------------------------------
def nothing_to_resume(run_dir: Path, contents: RunDirContents) -> str | None:
    """Why `run_dir` holds no run that `--resume` could continue (one line saying how to
    start a fresh one instead), or None when it holds one."""
    if not run_dir.exists():
        why, fix = "it does not exist", "drop --resume to start a fresh run there"
    elif contents.progressed:
        return None
    elif contents.started:
        why, fix = ("its run never completed a step (no checkpoint, metrics or model)",
                    "drop --resume to start the run over")
    elif contents.foreign:
        why, fix = (f"it holds no rlscale run, only {_sample(contents.foreign)}",
                    "drop --resume and choose a new or empty folder to start a fresh run")
    else:
        why, fix = "it is empty", "drop --resume to start a fresh run there"
    return f"nothing to resume in {run_dir}: {why}; {fix}"


def prepare_run_dir(run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                    extra_entries: Iterable[str] = (), resume_needs_run: bool = False) -> RunLock:
    """Check the contract for `run_dir`, take its lock, clean a killed run's leftovers.

    `resume_needs_run`: `--resume` as a user typed it, which must find a run to continue
    (else a one-line RunDirError); without it a resume of a folder with no run starts one
    (the experiments' "continue the arm, or start it").

    Returns the held lock; release it when the run ends (it is also released at exit)."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} is a file, not a folder")
    contents = inspect_run_dir(run_dir, extra_entries)
    if resume and resume_needs_run and not run_dir.exists():  # refused before it is made
        raise RunDirError(nothing_to_resume(run_dir, contents))
    if contents.foreign and not resume:
        raise RunDirError(
            f"run directory {run_dir} holds files rlscale did not write "
            f"({_sample(contents.foreign)}); choose a new or empty folder")
    # A start that failed before completing a step (e.g. a missing package) left only its
    # config and empty logs: nothing a user needs protecting, so the same command starts over.
    takeover = contents.started and not contents.progressed and not (resume or overwrite)
    if contents.started and not (resume or overwrite or takeover):
        raise RunDirError(
            f"run directory {run_dir} already holds a run; pass --resume to continue it, "
            "--overwrite to replace it, or choose another folder")
    _make_dir(run_dir, "run directory")
    lock = RunLock(run_dir / LOCK_NAME).acquire()
    try:
        if resume and resume_needs_run:
            # Looked at again under the lock: a run that held it a moment ago may have
            # written its first step since (a live one was refused by the lock itself).
            problem = nothing_to_resume(run_dir, inspect_run_dir(run_dir, extra_entries))
            if problem:
                raise RunDirError(problem)
        if takeover:
            print(f"note: {run_dir} holds a start that never completed a step (no checkpoint, "
                  "metrics or model); starting over in it", file=sys.stderr, flush=True)
        if overwrite or takeover:
            for name in contents.ours - {LOCK_NAME}:
                p = run_dir / name
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        clean_leftovers(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def check_model_out(out: str | Path, *, overwrite: bool = False) -> Path:
    """A folder a model may be written to: new, empty, or (with `overwrite`) a model folder
    rlscale wrote. Never a folder holding anything else."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"output {out} is a file, not a folder")
    names = [p.name for p in out.iterdir()] if out.is_dir() else []
    if names:
        if (out / MODEL_MARKER).is_file():
            if not overwrite:
                raise RunDirError(f"{out} already holds a model; pass --overwrite to replace it, "
                                  "or choose another folder")
        else:
            raise RunDirError(f"{out} is not empty and was not written by rlscale "
                              f"({_sample(names)}); choose a new or empty folder")
    _make_dir(out.parent if not out.exists() else out, "output folder")
    return out


def check_separate(out: str | Path, run_dir: str | Path) -> None:
    """The model output must not be the run directory or hold it (it is replaced whole)."""
    out, run_dir = Path(out).resolve(), Path(run_dir).resolve()
    if out == run_dir or out in run_dir.parents:
        raise RunDirError(f"out={out} would replace the run directory {run_dir}; "
                          "give the model a folder of its own (e.g. run_dir/model)")


# -- config-locked resume -----------------------------------------------------------------
@dataclass(frozen=True)
class ConfigChange:
    key: str
    old: Any
    new: Any
    free: bool   # speed or logging only: allowed without asking


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


_ABSENT = "<absent>"


def config_changes(recorded: dict[str, Any], current: dict[str, Any],
                   free_fields: Iterable[str]) -> list[ConfigChange]:
    """Differences between two config dicts, by dotted key; `free_fields` are glob patterns."""
    old, new = flatten(recorded), flatten(current)
    patterns = tuple(free_fields)
    changes = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if a != b:
            free = any(fnmatch.fnmatchcase(key, p) for p in patterns)
            changes.append(ConfigChange(key, a, b, free))
    return changes


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def describe(changes: Iterable[ConfigChange], limit: int = 6) -> str:
    items = [f"{c.key} {_short(c.old)} -> {_short(c.new)}" for c in changes]
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def read_recorded_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raise RunDirError(f"{path} is not valid YAML; cannot check the resumed config against "
                          "it (restore it, or pass --overwrite to start over)") from None
    return data if isinstance(data, dict) else None


def with_defaults(config_type: type[StrictModel], recorded: dict[str, Any]) -> dict[str, Any]:
    """A recorded config with the fields added since it was written at their defaults (so
    they compare equal to a current config that leaves them alone); as it is when it no
    longer validates."""
    try:
        return config_to_dict(config_type.model_validate(recorded))
    except ValueError:
        return recorded


def check_resume_config(run_dir: str | Path, config: StrictModel, *, done: int, length_key: str,
                        free_fields: Iterable[str], allow_change: bool,
                        recorded_in: str | Path | None = None) -> list[ConfigChange]:
    """The resume check of both loops, against the run's recorded config.yaml (or the one in
    `recorded_in`: a run continued in a new directory from another run's checkpoint).

    `config` is the config the resumed run will use, `done` the steps (or iterations) the run
    has done and `length_key` the field that plans them (`train.steps`): a plan below what is
    done is refused. Math-changing differences are refused too (unless `allow_change`); every
    difference is recorded in config_changes.jsonl with the step it takes effect from.
    Returns the changes."""
    current = config_to_dict(config)
    planned = flatten(current)[length_key]
    if done > planned:
        raise RunDirError(
            f"the run in {run_dir} has done {done} {length_key.rsplit('.', 1)[-1]}; "
            f"{length_key}={planned} is below that (raise it to continue the run)")
    recorded = read_recorded_config(Path(recorded_in if recorded_in is not None else run_dir))
    if recorded is None:
        return []
    changes = config_changes(with_defaults(type(config), recorded), current, free_fields)
    # Settings named by the user (objective, train.lr) before the fields derived from them.
    math_changes = sorted((c for c in changes if not c.free),
                          key=lambda c: (c.key.startswith("loss."), c.key))
    if math_changes and not allow_change:
        raise RunDirError(
            f"--resume with a config that changes the math of the run: {describe(math_changes)}; "
            "resume with the recorded config, or pass --allow-config-change to record the change")
    if changes:
        row = {"step": done + 1, "changes": {c.key: {"old": c.old, "new": c.new, "free": c.free}
                                             for c in changes}}
        with open(Path(run_dir) / CHANGES_NAME, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
    return changes


def resume_hint(run_dir: str | Path, command: list[str]) -> str:
    """What an interrupted run says: where it stopped and the command that continues it."""
    import shlex

    from .checkpoint import checkpoint_step, latest_checkpoint

    shown = " ".join(shlex.quote(part) for part in command if part != "--resume")
    if not inspect_run_dir(Path(run_dir)).progressed:  # `--resume` would find nothing to resume
        return (f"interrupted: the run in {run_dir} stopped before completing a step. "
                f"Start it again with: {shown}")
    latest = latest_checkpoint(run_dir)
    where = (f"its last checkpoint is step {checkpoint_step(latest)}" if latest is not None
             else "it has no checkpoint yet (a resume starts from step 0)")
    return f"interrupted: the run in {run_dir} stopped; {where}. Continue with: {shown} --resume"
