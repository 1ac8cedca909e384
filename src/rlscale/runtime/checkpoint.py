"""Atomic checkpoint directories, verified loading with fallback, and exact-resume RNG state."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

STEP_PREFIX = "step_"
NETWORKS_DIR = "networks"  # networks kept beside the checkpoints, never pruned (Zero's
# checkpoint.networks_every: the Elo curve over a long run)
T = TypeVar("T")

# Fault injection for the fault suite (tests/faults): RLSCALE_FAULT=name@n SIGKILLs this
# process the n-th time it passes the point `name`, so a kill lands exactly mid-write.
_FAULT_COUNTS: dict[str, int] = {}


def fault_point(name: str) -> None:
    spec = os.environ.get("RLSCALE_FAULT")
    if not spec:
        return
    want, _, nth = spec.partition("@")
    if want != name:
        return
    _FAULT_COUNTS[name] = _FAULT_COUNTS.get(name, 0) + 1
    if _FAULT_COUNTS[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


class CheckpointError(ValueError):
    """No usable checkpoint where one was expected; one line naming why."""


class WriteError(ValueError):
    """A checkpoint, model or metrics file could not be written (a full disk, a read-only
    file system, no permission); one line naming the path and the space it needs."""


# Errors of a write that the user can fix (space, permissions), whatever layer raised them:
# torch.save reports a full disk as RuntimeError("[enforce fail at inline_container.cc...]
# ... file write failed"), safetensors as SafetensorError("Error while serializing: I/O
# error: No space left on device (os error 28)") (neither an OSError nor a RuntimeError),
# the json and TensorBoard writers as OSError. Text -> the reason shown.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG}
_WRITE_FAILURE_TEXT = {"no space left": "No space left on device",
                       "file write failed": "No space left on device",
                       "inline_container": "No space left on device",
                       "disk quota": "Disk quota exceeded",
                       "read-only file system": "Read-only file system",
                       "permission denied": "Permission denied",
                       "file too large": "File too large"}


def write_failure(exc: BaseException) -> str | None:
    """Why `exc` is a failed write the user can fix (e.g. 'No space left on device'), else
    None (a bug or an interrupt, to be raised as it is)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS:
            return exc.strerror or os.strerror(exc.errno)
        if isinstance(exc, Exception):
            text = str(exc).lower()
            for needle, reason in _WRITE_FAILURE_TEXT.items():
                if needle in text:
                    return reason
        exc = exc.__cause__ or exc.__context__
    return None


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def write_error(path: Path, reason: str, needs_bytes: int, kept: str) -> WriteError:
    try:
        free = shutil.disk_usage(path.parent if not path.exists() else path).free
        space = f"{free / 2**20:.0f} MiB free there"
    except OSError:
        space = "free space unknown"
    need = f", about {needs_bytes / 2**20:.0f} MiB needed" if needs_bytes else ""
    return WriteError(f"cannot write {path}: {reason} ({space}{need}); {kept}")


def checkpoint_path(run_dir: str | Path, step: int, folder: str = "checkpoints") -> Path:
    """`folder`: `checkpoints` (what a resume loads) or NETWORKS_DIR."""
    return Path(run_dir) / folder / f"{STEP_PREFIX}{step:06d}"


def list_checkpoints(run_dir: str | Path, folder: str = "checkpoints") -> list[Path]:
    root = Path(run_dir) / folder
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX)]
    found = [p for p in found if p.name[len(STEP_PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(STEP_PREFIX):]))


def checkpoint_step(path: str | Path) -> int:
    return int(Path(path).name[len(STEP_PREFIX):])


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """`text` at `path`, whole or not at all: written beside as `.tmp-NAME-PID`, then renamed
    over it (a full disk or a kill mid-write leaves the old file as it was). Errors are
    raised; the temporary file is not left behind."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; rename it into place only on success.

    A process killed mid-write leaves a `.tmp-*` directory, never a half-written `path`,
    so `latest_checkpoint` only ever sees complete checkpoints.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    except OSError as exc:
        reason = write_failure(exc)
        if reason is None:
            raise
        raise write_error(path, reason, 0, "nothing was changed") from None
    try:
        yield tmp
        fault_point("checkpoint-write")
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if path.exists():
            # Replace an older copy (e.g. `final/` from an earlier attempt) in two renames.
            trash = path.with_name(f".old-{path.name}-{os.getpid()}")
            os.rename(path, trash)
            fault_point("checkpoint-replace")
            os.rename(tmp, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException as exc:
        reason = write_failure(exc)
        if reason is None:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # What the write would need: the newest checkpoint beside it (the same kind of
        # write), else what it had written when it failed.
        previous = list_checkpoints(path.parent.parent)[-1:] if path.name.startswith(
            STEP_PREFIX) else []
        needs = max([_tree_bytes(tmp)] + [_tree_bytes(p) for p in previous])
        shutil.rmtree(tmp, ignore_errors=True)
        kept = (f"the previous copy of {path.name} is kept" if path.exists() else
                "earlier checkpoints are kept") + "; free space, then run again with --resume"
        raise write_error(path, reason, needs, kept) from None


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file cannot be read (a torn header, data cut short), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated (no header)"
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                return f"{path.name} is truncated (header cut short)"
            header = json.loads(f.read(length))
    except (OSError, ValueError) as exc:
        return f"{path.name} has an unreadable header ({type(exc).__name__})"
    ends = [v["data_offsets"][1] for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v]
    if 8 + length + max(ends, default=0) > size:
        return f"{path.name} is truncated ({size} bytes, its header needs {8 + length + max(ends)})"
    return None


def checkpoint_problem(path: Path) -> str | None:
    """A cheap check of every weights file of a checkpoint; the loader checks the rest."""
    for f in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(f)
        if problem:
            return problem
    return None


def load_latest_usable(run_dir: str | Path, load: Callable[[Path], T],
                       ) -> tuple[Path, T] | None:
    """`load` the newest checkpoint that verifies and loads; warn about each one skipped.

    A checkpoint torn by a disk error or a copy gone wrong costs the steps since the one
    before it, not the run. None when there are no checkpoints at all."""
    found = list_checkpoints(run_dir)
    problems = []
    for path in reversed(found):
        problem = checkpoint_problem(path)
        if problem is None:
            try:
                return path, load(path)
            except Exception as exc:  # noqa: BLE001 - any failure to load means "unusable"
                text = str(exc).strip().splitlines()
                problem = f"{type(exc).__name__}: {text[0][:160] if text else ''}".rstrip(": ")
        problems.append(f"{path.name}: {problem}")
        print(f"warning: checkpoint {path} is unusable ({problem}); trying the one before it",
              file=sys.stderr, flush=True)
    if found:
        raise CheckpointError(f"no usable checkpoint in {Path(run_dir) / 'checkpoints'} "
                              f"({'; '.join(problems)[:300]})")
    return None


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
