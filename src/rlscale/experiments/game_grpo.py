"""GRPO on a two-player game, without search: what remains of AlphaZero when search is
unaffordable. A small trainer for the experiments, written here because no library does
policy-gradient self-play on rlscale's `Game` protocol; the objective is rlvr's own code
(`group_advantages`, `token_level_loss`), the network is Zero's.

One step:
1. `positions` start positions, each a uniformly random opening of 0..`opening_plies` random
   legal moves from the initial position (the openings cover the board; the policy plays
   the rest);
2. `group` games from each start, both sides sampled from the current policy (temperature 1
   over the legal moves), all games moved in lockstep with one batched network call per ply;
3. the reward of a game is its outcome for the player to move at the start (+1, 0, -1); the
   group's mean is the baseline (`group_advantages`, GRPO's std normalisation on). The start
   player's moves take the game's advantage, the opponent's moves its negative: a zero-sum
   game's outcome is the same signal seen from the other side;
4. one on-policy update: every move is a token of its game's "sequence", the clipped
   surrogate at ratio 1 (on-policy: the policy gradient itself), token-mean aggregation.

The cost that matters for the comparison with AlphaZero is the network positions evaluated
while playing (`Progress.evaluations`): one per move here, one per simulation for a search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..rlvr.advantages import group_advantages
from ..rlvr.objectives import Aggregation, token_level_loss
from ..zero.games.base import Game
from ..zero.network import PolicyValueNet


@dataclass(frozen=True)
class GRPOGameSettings:
    evaluations: int            # the budget: network positions evaluated while playing
    positions: int = 64         # start positions per step
    group: int = 8              # games from each start position
    opening_plies: int = 4      # random moves before a start position: 0..this, uniform
    lr: float = 2e-3
    weight_decay: float = 1e-4
    clip: float = 0.2           # the surrogate's clip (inactive at ratio 1; kept for reuse)


@dataclass
class Progress:
    steps: int = 0
    evaluations: int = 0        # network positions evaluated while playing
    games: int = 0
    moves_trained: int = 0
    curve: list[tuple[int, float]] = field(default_factory=list)  # (evaluations, score)


@dataclass(frozen=True)
class PlayedGroup:
    """`positions x group` games (rows in group order) and every move in them."""

    planes: np.ndarray          # [M, *plane_shape] the position before each move
    legal: np.ndarray           # [M, A]
    actions: np.ndarray         # [M]
    game_index: np.ndarray      # [M] which game the move belongs to
    same_side: np.ndarray       # [M] bool: moved by the start position's player to move
    rewards: np.ndarray         # [G] each game's outcome for its start player
    evaluations: int


def random_start(game: Game, rng: np.random.Generator, max_plies: int) -> Any:
    """The initial position after 0..max_plies uniformly random moves that do not end it."""
    state = game.initial_state()
    for _ in range(int(rng.integers(0, max_plies + 1))):
        action = int(rng.choice(np.flatnonzero(game.legal_mask(state))))
        after = game.apply(state, action)
        if game.is_terminal(after):
            break
        state = after
    return state


def sample_legal(priors: np.ndarray, legal: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One move per row, drawn from the priors renormalised over the legal moves."""
    p = np.where(legal, priors, 0.0).astype(np.float64)
    p /= p.sum(axis=1, keepdims=True)
    cumulative = np.cumsum(p, axis=1)
    draws = rng.random(len(p))[:, None] * cumulative[:, -1:]
    return np.minimum((cumulative <= draws).sum(axis=1), p.shape[1] - 1)


def play_group(game: Game, net: PolicyValueNet, starts: list[Any], group: int,
               rng: np.random.Generator) -> PlayedGroup:
    """`group` games from every start, both sides sampled from `net`'s policy."""
    states = [s for s in starts for _ in range(group)]
    start_player = np.array([game.to_play(s) for s in states])
    planes, legal, actions, index, mover = [], [], [], [], []
    live = [i for i, s in enumerate(states) if not game.is_terminal(s)]
    evaluations = 0
    while live:
        batch_planes = np.stack([game.planes(states[i]) for i in live])
        batch_legal = np.stack([game.legal_mask(states[i]) for i in live])
        priors, _ = net.evaluate(batch_planes)
        evaluations += len(live)
        chosen = sample_legal(priors, batch_legal, rng)
        planes.append(batch_planes)
        legal.append(batch_legal)
        actions.append(chosen)
        index.append(np.array(live))
        mover.append(np.array([game.to_play(states[i]) for i in live]))
        for i, action in zip(live, chosen, strict=True):
            states[i] = game.apply(states[i], int(action))
        live = [i for i in live if not game.is_terminal(states[i])]
    outcome = np.array([game.outcome(s) for s in states], dtype=np.float32)  # player 0's view
    rewards = np.where(start_player == 0, outcome, -outcome)
    game_index = np.concatenate(index)
    same_side = np.concatenate(mover) == start_player[game_index]
    return PlayedGroup(np.concatenate(planes), np.concatenate(legal), np.concatenate(actions),
                       game_index, same_side, rewards, evaluations)


def move_advantages(played: PlayedGroup, group: int) -> np.ndarray:
    """[M]: each move's advantage, its game's group-relative one (GRPO: mean baseline, std
    normalised), negated for the opponent's moves."""
    per_game = group_advantages(torch.from_numpy(played.rewards), group,
                                std_normalize=True).numpy()
    signed = per_game[played.game_index]
    return np.where(played.same_side, signed, -signed).astype(np.float32)


def update(net: PolicyValueNet, optimiser: torch.optim.Optimizer, played: PlayedGroup,
           advantages: np.ndarray, clip: float) -> float:
    """One on-policy step over every move (a token each); returns the loss."""
    net.train()
    logits, _ = net(torch.from_numpy(played.planes))
    logits = logits.float().masked_fill(~torch.from_numpy(played.legal), float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    taken = logp.gather(1, torch.from_numpy(played.actions).long()[:, None])[:, 0]
    ratio = torch.exp(taken - taken.detach())[None, :]      # one row: every move a token
    mask = torch.ones_like(ratio)
    loss = token_level_loss(ratio, torch.from_numpy(advantages)[None, :], mask,
                            clip_low=clip, clip_high=clip, behaviour_weight=None,
                            aggregate=Aggregation("token-mean"))
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    optimiser.step()
    return float(loss.detach())


def train_grpo(game: Game, net: PolicyValueNet, settings: GRPOGameSettings, seed: int,
               score: Callable[[PolicyValueNet], float] | None = None,
               score_points: int = 10) -> Progress:
    """Train `net` in place until the evaluation budget is spent. With `score`, `score(net)`
    is recorded at the start and after each further `1/score_points` of the budget (the last
    step that crosses a mark), so every seed's curve has the same `score_points + 1` points,
    at budget fractions 0, 1/score_points, ..., 1."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    optimiser = torch.optim.AdamW(net.parameters(), lr=settings.lr,
                                  weight_decay=settings.weight_decay)
    progress = Progress()
    marks = [settings.evaluations * k / score_points for k in range(score_points + 1)]

    def record() -> None:
        """Every mark reached since the last call gets the current score (judged once)."""
        done = progress.evaluations >= settings.evaluations
        reached = [m for m in marks[len(progress.curve):] if done or progress.evaluations >= m]
        if score is not None and reached:
            value = score(net)
            progress.curve += [(round(m), value) for m in reached]

    record()
    while progress.evaluations < settings.evaluations:
        starts = [random_start(game, rng, settings.opening_plies)
                  for _ in range(settings.positions)]
        played = play_group(game, net, starts, settings.group, rng)
        update(net, optimiser, played, move_advantages(played, settings.group), settings.clip)
        progress.steps += 1
        progress.evaluations += played.evaluations
        progress.games += len(played.rewards)
        progress.moves_trained += len(played.actions)
        record()
    net.eval()
    return progress
