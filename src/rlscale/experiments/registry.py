"""The registry of experiments, in the order `list` and the report show them.

`NAMES` and `claims()` are light: `rlscale experiments list` reads each module's `CLAIM`
from its source, without importing it (an experiment imports torch and matplotlib: seconds
of a command that prints text). `EXPERIMENTS` imports them all, on first use."""

from __future__ import annotations

import ast
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spec import Experiment

# Each is the module rlscale.experiments.<name>, whose EXPERIMENT has this name.
NAMES = (
    "pass_at_k", "kl_anchor", "clipping", "clip_higher", "dynamic_sampling", "length_norm",
    "length_penalty", "gspo_ratio_variance", "baseline_variance", "forking_tokens", "tool_use",
    "staleness", "continuum", "ppo_critic", "curriculum", "emergence", "checking",
    "zero_value_target", "zero_prior", "grpo_vs_zero",
    "grpo_vs_zero_connect4", "zero_compute", "zero_elo", "selfplay_cycles",
    "go_switches",
)


def module_claim(name: str) -> str:
    """The `CLAIM = "..."` string literal at the top level of experiment `name`'s module."""
    source = Path(__file__).with_name(f"{name}.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "CLAIM" for target in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"experiment module {name} has no CLAIM string")


def claims() -> dict[str, str]:
    """Every experiment's one-sentence claim, in registry order, without importing any."""
    return {name: module_claim(name) for name in NAMES}


EXPERIMENTS: dict[str, Experiment]  # set by __getattr__ on first use


def __getattr__(attribute: str) -> Any:
    # PEP 562: `from .registry import EXPERIMENTS` imports the experiment modules then, not
    # when `list` imports NAMES.
    if attribute != "EXPERIMENTS":
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    experiments = {name: import_module(f"{__package__}.{name}").EXPERIMENT for name in NAMES}
    globals()["EXPERIMENTS"] = experiments
    return experiments
