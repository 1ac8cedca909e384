import os
from pathlib import Path

import pytest

# One thread per test process: CI has 2 cores and tests measure behaviour, not speed.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A freshly initialised tiny model saved as a Hugging Face folder."""
    from rlscale.rlvr.model import init_model

    return init_model("tiny", tmp_path_factory.mktemp("tiny") / "model", seed=0)
