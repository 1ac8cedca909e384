"""Experiment trackers beside TensorBoard: Weights & Biases and trackio, each optional.

A tracker gets what TensorBoard gets: every numeric scalar of a step under its metrics.jsonl
name, with the run's step as the step, and the resolved config once at the start. Its files
live in the run directory, never in the home directory:

- `wandb/`: offline runs (`wandb/offline-run-*`) unless wandb has credentials (WANDB_API_KEY,
  .netrc or its settings; looked up, not verified over the network); upload them later with
  `wandb sync <run_dir>/wandb/offline-run-*`. WANDB_MODE, when set, decides instead.
- `trackio/`: trackio's local database; `TRACKIO_DIR=<run_dir>/trackio trackio show` opens it.

A resumed run continues the same tracker run: the W&B run id is kept in `wandb/rlscale-run-id`,
the trackio run is found by name.
"""

from __future__ import annotations

import contextlib
import io
import netrc
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from ..config import ConfigError, LoggingConfig

WANDB_ID_FILE = "rlscale-run-id"  # inside <run_dir>/wandb/


class TrackerNotInstalledError(ConfigError):
    """`logging.<tracker>: true` but its package is missing; one line saying what to install."""


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _require(package: str) -> None:
    try:
        __import__(package)
    except ImportError:
        raise TrackerNotInstalledError(
            f"logging.{package} is true but the {package} package is not installed "
            f"(pip install 'rlscale[{package}]')") from None


def check_trackers(logging: LoggingConfig) -> None:
    """Raise TrackerNotInstalledError if a tracker the config turns on cannot be imported."""
    for package in ("wandb", "trackio"):
        if getattr(logging, package):
            _require(package)


def open_trackers(logging: LoggingConfig, run_dir: str | Path, config: dict[str, Any],
                  resume_step: int | None = None) -> list[Tracker]:
    """The trackers `logging` turns on, started for the run in `run_dir` (continued when
    `resume_step` is given) with the resolved `config`."""
    check_trackers(logging)
    run_dir = Path(run_dir)
    name = logging.run_name or run_dir.resolve().name
    resume = resume_step is not None
    trackers: list[Tracker] = []
    try:
        if logging.wandb:
            trackers.append(WandbTracker(run_dir, logging.project, name, config, resume=resume))
        if logging.trackio:
            trackers.append(TrackioTracker(run_dir, logging.project, name, config, resume=resume))
    except BaseException:
        for tracker in trackers:
            tracker.close()
        raise
    return trackers


# -- Weights & Biases -----------------------------------------------------------------------
def wandb_has_credentials() -> bool:
    """Whether wandb would log in without asking: an API key or identity token in the
    environment, .netrc or wandb's settings. No network call."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:  # wandb's own lookup (wandb.sdk.lib.wbauth, in recent versions)
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth

        settings = wandb_setup.singleton().settings
        host = wbauth.HostUrl(settings.base_url, app_url=settings.app_url)
        return wbauth.authenticate_session(host=host, source="rlscale", prompt=False,
                                           update_session=False) is not None
    except (ImportError, AttributeError, TypeError):
        pass
    except Exception:  # credentials found but malformed: let wandb.init report them
        return True
    # Older wandb: the .netrc entry of its server.
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker:
    """A W&B run whose files are in `<run_dir>/wandb`."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict[str, Any], *,
                 resume: bool) -> None:
        import wandb

        self._wandb = wandb
        folder = run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else ""
        if not run_id:
            run_id = uuid.uuid4().hex[:12]
            id_file.write_text(run_id + "\n")
        if os.environ.get("WANDB_MODE"):
            mode = None  # the user's explicit choice
        else:
            mode = "online" if wandb_has_credentials() else "offline"
        # wandb prints where the run's files are and, at the end, the `wandb sync` command.
        self.run = wandb.init(project=project, name=name, id=run_id, dir=str(run_dir),
                              config=config, mode=mode, resume="allow" if resume else None)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()
        if self._wandb.run is None:
            # End wandb's background service (wandb-core): no process outlives the run.
            self._wandb.teardown()


# -- trackio --------------------------------------------------------------------------------
def _import_trackio(folder: Path) -> Any:
    """trackio, storing its database in `folder`.

    trackio reads TRACKIO_DIR once, at import, into module constants (TRACKIO_DIR, MEDIA_DIR,
    ARTIFACTS_DIR) that several of its modules copy: the first import sees `folder` in the
    environment, and a later run in the same process re-points the copies."""
    before = os.environ.get("TRACKIO_DIR")
    os.environ["TRACKIO_DIR"] = str(folder)
    try:
        import trackio
    finally:
        if before is None:
            del os.environ["TRACKIO_DIR"]
        else:
            os.environ["TRACKIO_DIR"] = before
    new = {"TRACKIO_DIR": folder, "MEDIA_DIR": folder / "media",
           "ARTIFACTS_DIR": folder / "artifacts"}
    for module_name, module in list(sys.modules.items()):
        if module is not None and (module_name == "trackio" or module_name.startswith("trackio.")):
            for attr, value in new.items():
                if isinstance(getattr(module, attr, None), Path):
                    setattr(module, attr, value)
    return trackio


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """trackio's run start asks the Hugging Face Hub who the user is (to record a user
    name) whenever an HF token is configured, even when it logs locally: keep the Hub offline
    meanwhile, so that question fails at once instead of reaching the network."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


class TrackioTracker:
    """A trackio run in the local database `<run_dir>/trackio/<project>.db`."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict[str, Any], *,
                 resume: bool) -> None:
        folder = (run_dir / "trackio").resolve()
        folder.mkdir(parents=True, exist_ok=True)
        self._trackio = trackio = _import_trackio(folder)
        # trackio prints its dashboard instructions on every start and finish: the run's
        # own output stays readable.
        with contextlib.redirect_stdout(io.StringIO()), _hub_offline():
            self.run = trackio.init(project=project, name=name, config=config,
                                    resume="allow" if resume else "never", embed=False,
                                    auto_log_cpu=False, auto_log_gpu=False)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            if self._trackio.context_vars.current_run.get() is self.run:
                self._trackio.finish()  # also forgets the run, so exit does not finish it again
            else:
                self.run.finish()
