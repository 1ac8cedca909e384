"""The fault-injection suite: every way rlscale could lose a user's data or crash on them."""

import pytest


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("RLSCALE_FAULT", raising=False)
