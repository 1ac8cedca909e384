"""A Zero run's training state apart from the run: what `--resume-from` continues and what
`rlscale zero export-state` writes (the network, optimiser, counters and RNGs, without the
replay window and the games in flight: megabytes instead of tens, small enough to commit
beside the code, so a run longer than one sitting survives a fresh clone)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..runtime.checkpoint import atomic_dir, latest_checkpoint

# What a run needs to go on learning where it stopped, without the replay window and the games
# in flight (megabytes instead of tens): small enough to commit beside the code, so a run
# longer than one sitting survives a fresh clone. The model files also make it a playable
# model folder.
TRAINING_STATE_FILES = ("model.json", "model.safetensors", "trainer.pt")


def training_state(path: str | Path) -> Path:
    """The checkpoint `path` names for `--resume-from`: a folder holding trainer.pt (a
    checkpoint, or one export_training_state wrote), or a run directory's newest checkpoint."""
    path = Path(path)
    found = path if (path / "trainer.pt").is_file() else latest_checkpoint(path)
    if found is None or not all((found / name).is_file() for name in TRAINING_STATE_FILES):
        raise FileNotFoundError(f"{path} holds no checkpoint (a folder with "
                                f"{', '.join(TRAINING_STATE_FILES)}, or a run directory)")
    return found


def recorded_config_dir(checkpoint: Path) -> Path:
    """Where the config of the run that wrote `checkpoint` lies: beside it (an exported
    state) or in its run directory (run/checkpoints/step_N)."""
    return checkpoint if (checkpoint / "config.yaml").is_file() else checkpoint.parent.parent


def export_training_state(path: str | Path, out: str | Path) -> Path:
    """Copy the training state of the checkpoint `path` names (TRAINING_STATE_FILES and its
    run's config.yaml) into the new folder `out`; `rlscale zero train --resume-from out`
    continues that run. Refuses an `out` that exists: nothing of the user's is replaced."""
    source, out = training_state(path), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; export the training state to a new folder")
    config = recorded_config_dir(source) / "config.yaml"
    with atomic_dir(out) as tmp:
        for name in TRAINING_STATE_FILES:
            shutil.copy2(source / name, tmp / name)
        if config.is_file():
            shutil.copy2(config, tmp / "config.yaml")
    return out


def saved_iteration(checkpoint: Path) -> int:
    """The iteration a checkpoint was saved at (its model.json's counters)."""
    return int(json.loads((checkpoint / "model.json").read_text())["extra"]["counters"]["iteration"])
