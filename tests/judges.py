"""Judgements for `experiments.parallel.judge_at_once`'s test, in a module of their own: a
spawned worker imports the module of the function it runs, and this one imports only torch
(the test module would cost each worker ~10 s of imports)."""

from __future__ import annotations

import os

import torch


def where_judged(item: int) -> tuple[int, int, int]:
    """A judgement that says where it ran: (item, process, torch threads)."""
    if item < 0:
        raise ValueError(f"cannot judge item {item}")
    return item, os.getpid(), torch.get_num_threads()
