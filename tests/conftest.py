import os
from pathlib import Path

import pytest

# One thread per test process: CI has 2 cores and tests measure behaviour, not speed.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from cores import every_core  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session", autouse=True)
def _probe_cache(tmp_path_factory):
    """The precision probe's cache (compute_dtype: auto) in the session's temp folder, not in
    the user's home; CLI runs in subprocesses inherit it."""
    previous = os.environ.get("RLSCALE_CACHE_DIR")
    os.environ["RLSCALE_CACHE_DIR"] = str(tmp_path_factory.mktemp("rlscale_cache"))
    yield
    if previous is None:
        os.environ.pop("RLSCALE_CACHE_DIR", None)
    else:
        os.environ["RLSCALE_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A freshly initialised tiny model saved as a Hugging Face folder."""
    from rlscale.rlvr.model import init_model

    return init_model("tiny", tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def all_cores():
    """torch on every core for the test (tests/cores.py)."""
    with every_core():
        yield
