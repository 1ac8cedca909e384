"""Threads for the few long single-process tests (tests/ is on sys.path under pytest)."""

import contextlib
import os

import torch


@contextlib.contextmanager
def every_core():
    """torch on every core for the block, then one thread again (the suite's default,
    tests/conftest.py): for the long single-process trainings (the reasoning learning test,
    the quick experiments), which run alone on the machine (the suite is not parallel) and
    take about half as long on CI's two cores. Their results do not depend on the thread
    count (the reasoning learning test: the same pass@1, 0.219 -> 0.297, at 1 and 2)."""
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(1)
