"""The registry of experiments, in the order `list` and the report show them."""

from __future__ import annotations

from . import (
    baseline_variance,
    clip_higher,
    clipping,
    continuum,
    dynamic_sampling,
    forking_tokens,
    grpo_vs_zero,
    grpo_vs_zero_connect4,
    gspo_ratio_variance,
    kl_anchor,
    length_norm,
    length_penalty,
    pass_at_k,
    staleness,
    tool_use,
    zero_compute,
    zero_elo,
    zero_prior,
    zero_value_target,
)
from .spec import Experiment

EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    pass_at_k.EXPERIMENT, kl_anchor.EXPERIMENT, clipping.EXPERIMENT, clip_higher.EXPERIMENT,
    dynamic_sampling.EXPERIMENT, length_norm.EXPERIMENT, length_penalty.EXPERIMENT,
    gspo_ratio_variance.EXPERIMENT, baseline_variance.EXPERIMENT, forking_tokens.EXPERIMENT,
    tool_use.EXPERIMENT, staleness.EXPERIMENT, continuum.EXPERIMENT,
    zero_value_target.EXPERIMENT, zero_prior.EXPERIMENT, grpo_vs_zero.EXPERIMENT,
    grpo_vs_zero_connect4.EXPERIMENT, zero_compute.EXPERIMENT, zero_elo.EXPERIMENT)}
