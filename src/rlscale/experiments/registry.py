"""The registry of experiments, in the order `list` and the report show them."""

from __future__ import annotations

from . import clipping, kl_anchor, pass_at_k
from .spec import Experiment

EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    pass_at_k.EXPERIMENT, kl_anchor.EXPERIMENT, clipping.EXPERIMENT)}
