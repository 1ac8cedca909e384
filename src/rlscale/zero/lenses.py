"""The figures a Zero iteration logs, by lens: credit assignment (value loss, outcomes),
bias and variance (policy loss, how far search moves from the prior), the moving
distribution (entropy, game length, distinct games), staleness, resignation, speed and the
counters; and the guard's reading of an iteration's updates."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..runtime.health import parameters_finite
from .replay import ReplayWindow
from .selfplay import PlayStats


@dataclass
class Counters:
    """A run's running totals, summed over resumes."""

    iteration: int = 0
    games: int = 0
    samples: int = 0
    learner_steps: int = 0
    version: int = 0
    seconds: float = 0.0  # wall time spent in iterations, summed over resumes


def nonfinite_figures(losses: list[dict[str, float]], net: torch.nn.Module) -> list[str]:
    """The non-finite figures of an iteration's updates: a loss, or the weights themselves."""
    bad = sorted({k for x in losses for k, v in x.items() if not math.isfinite(v)})
    if not parameters_finite(net.parameters()):
        bad.append("weights")
    return bad


def lens_metrics(
    play: PlayStats,
    losses: list[dict[str, float]],
    lag: dict[str, float],
    samples: Any,
    replay: ReplayWindow,
    c: Counters,
    seconds: float,
    train_seconds: float,
    lr: float,
    held_out: dict[str, float] | None = None,
) -> dict[str, Any]:
    outcomes = np.array(play.outcomes)
    m: dict[str, Any] = {}
    # credit assignment: is the value learnable and are outcomes balanced?
    if losses:
        m["credit/value_loss"] = float(np.mean([x["value_loss"] for x in losses]))
    if held_out:
        # the same losses on the new games, before training on them (value against z alone)
        m["credit/held_out_value_loss"] = held_out["value_loss"]
        m["bias_variance/held_out_policy_loss"] = held_out["policy_loss"]
    m["credit/outcome_p0_win"] = float((outcomes > 0).mean())
    m["credit/outcome_draw"] = float((outcomes == 0).mean())
    m["credit/outcome_p1_win"] = float((outcomes < 0).mean())
    # bias-variance: how far the search moves from the prior, how well the net follows it
    if losses:
        m["bias_variance/policy_loss"] = float(np.mean([x["policy_loss"] for x in losses]))
    m["bias_variance/search_prior_kl"] = play.kl_sum / max(len(samples), 1)
    # KataGo's auxiliary targets, over the batches that had a played-out game
    for key, name in (("ownership_loss", "loss/ownership"), ("score_loss", "loss/score")):
        values = [x[key] for x in losses if key in x]
        if values:
            m[name] = float(np.mean(values))
    # moving distribution: the policy's entropy and the games it plays
    if losses:
        m["moving/policy_entropy"] = float(np.mean([x["policy_entropy"] for x in losses]))
    m["moving/game_length"] = float(np.mean(play.lengths))
    # share of this iteration's games that differ from each other (1 = all distinct); near
    # 1/games means self-play has collapsed onto one line (see selfplay.random_opening_share)
    m["moving/distinct_games"] = len(play.sequences) / max(play.games, 1)
    # staleness: version lag of the replay samples trained on
    m.update(lag)
    # resignation
    if play.resigned or play.playout_would_resign:
        m["selfplay/resigned_share"] = play.resigned / max(play.games, 1)
        m["selfplay/false_resign_rate"] = play.false_resignations / max(play.playout_would_resign, 1)
    # speed and counters
    m["train/lr"] = lr
    m["speed/games_per_hour"] = play.games / seconds * 3600.0
    m["speed/simulations_per_second"] = play.simulations / max(play.seconds, 1e-9)
    m["speed/selfplay_seconds"] = play.seconds
    m["speed/train_seconds"] = train_seconds
    m["replay/size"] = len(replay)
    m["replay/window"] = replay.window()
    if replay.earlier:  # resumed without its replay: 1 while learning waits for the refill
        m["replay/refilling"] = float(replay.refilling())
    m["counters/games"] = c.games
    m["counters/samples"] = c.samples
    m["counters/learner_steps"] = c.learner_steps
    m["counters/version"] = c.version
    m["counters/seconds"] = c.seconds
    return m
