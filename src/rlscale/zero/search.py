"""The search a config asks for: the Gumbel policy when `config.gumbel`, else PUCT.

`search` searches trees of a `Forest` (self-play keeps them between moves); `search_states`
searches fresh trees for a list of positions (play, the arena, analysis).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .config import MCTSConfig
from .forest import Forest
from .games.base import Game
from .gumbel import gumbel_policy
from .mcts import Evaluator, SearchResult
from .puct import puct_policy


def search(forest: Forest, evaluator: Evaluator, config: MCTSConfig, rng: np.random.Generator,
           **options: Any) -> SearchResult:
    """Run the policy `config` asks for (`gumbel_policy` or `puct_policy`, which share one
    signature) from the roots of `options["trees"]` (default: every tree), with
    `options["simulations"]` per tree (default config.simulations).

    add_noise: root exploration for self-play — Dirichlet noise on the priors (PUCT) or
    Gumbel noise on the sampled actions (Gumbel). Never used in evaluation.
    temperature: PUCT move choice; > 0 samples from visits^(1/tau), 0 takes the most
    visited. The Gumbel search chooses by sequential halving (its noise is the sampling).
    """
    policy = gumbel_policy if config.gumbel else puct_policy
    return policy(forest, evaluator, config, rng, **options)


def search_states(
    game: Game,
    states: Sequence[Any],
    evaluator: Evaluator,
    config: MCTSConfig,
    rng: np.random.Generator | None = None,
    **kwargs: Any,
) -> SearchResult:
    """Fresh trees for `states`, searched together (a convenience for one-off searches)."""
    forest = Forest(game, len(states), capacity=config.simulations + 1)
    for i, state in enumerate(states):
        forest.reset(i, state)
    return search(forest, evaluator, config, rng or np.random.default_rng(), **kwargs)
