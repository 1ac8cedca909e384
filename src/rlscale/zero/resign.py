"""Resignation: which played-out games would have been resigned, and the threshold that keeps
false resignations rare.

AlphaGo Zero resigns a game when the root value of the player to move drops below v_resign,
and picks v_resign automatically: resignation is disabled in a share of self-play games
(10% there, `selfplay.resign_playout_share` here), those games are played to the end, and
v_resign is set so that fewer than 5% of the would-be resignations in them were false ones
(the resigning player would not have lost). Played-out games are an unbiased sample of all
games, so they answer "what if the threshold were t?" for any t, not only the current one.

A false resignation is one by a player who then won or drew. The rate is taken over the
played-out games in which someone would have resigned (the label noise of resigned games:
a resigned game is trained on as a loss), the figure the loop logs as
`selfplay/false_resign_rate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Candidate thresholds: resigning at a positive value makes no sense, and values are in [-1, 1].
THRESHOLD_GRID = np.round(np.arange(-1.0, 0.0 + 1e-9, 0.01), 2)


@dataclass(frozen=True)
class PlayedOut:
    """A game played to the end with resignation disabled: every searched move's ply, the
    player to move and the root value from that player's view, and the outcome."""

    plies: np.ndarray  # [m] int
    players: np.ndarray  # [m] int
    values: np.ndarray  # [m] float
    outcome: float  # from player 0's view

    @staticmethod
    def from_checks(checks: Sequence[tuple[int, int, float]], outcome: float) -> PlayedOut:
        """From (ply, player, root value) triples in the order they were played."""
        plies, players, values = zip(*checks, strict=True) if checks else ((), (), ())
        return PlayedOut(np.array(plies, np.int64), np.array(players, np.int64),
                         np.array(values, np.float64), float(outcome))


def first_resignation(game: PlayedOut, threshold: float, min_moves: int) -> int | None:
    """The player who would have resigned first at `threshold` (the same rule as self-play:
    at ply >= min_moves, root value below the threshold), or None."""
    hit = np.flatnonzero((game.plies >= min_moves) & (game.values < threshold))
    return int(game.players[hit[0]]) if hit.size else None


def is_false_resignation(game: PlayedOut, player: int) -> bool:
    """Would `player` resigning have been wrong: did they win or draw in the end?"""
    return (game.outcome if player == 0 else -game.outcome) >= 0


def resignation_counts(games: Sequence[PlayedOut], thresholds: Sequence[float] | np.ndarray,
                       min_moves: int) -> tuple[np.ndarray, np.ndarray]:
    """(false, would) per threshold: of `games`, how many someone would have resigned, and
    how many of those resignations would have been false. `first_resignation` for every
    threshold at once: the first ply whose value is below t is the first at which the
    running minimum of the values is."""
    thresholds = np.asarray(thresholds, np.float64)
    false = np.zeros(len(thresholds), np.int64)
    would = np.zeros(len(thresholds), np.int64)
    for game in games:
        eligible = game.plies >= min_moves
        values, players = game.values[eligible], game.players[eligible]
        if not len(values):
            continue
        lowest = np.minimum.accumulate(values)
        # -lowest is non-decreasing: the first index with lowest < t, i.e. -lowest > -t
        first = np.searchsorted(-lowest, -thresholds, side="right")
        hit = first < len(values)
        resigner = players[np.minimum(first, len(values) - 1)]
        loser_view = np.where(resigner == 0, game.outcome, -game.outcome)
        would += hit
        false += hit & (loser_view >= 0)
    return false, would


def false_resignations(games: Sequence[PlayedOut], threshold: float,
                       min_moves: int) -> tuple[int, int]:
    """(false, would) at one threshold."""
    false, would = resignation_counts(games, [threshold], min_moves)
    return int(false[0]), int(would[0])


def tune_threshold(games: Sequence[PlayedOut], *, target: float, min_moves: int,
                   min_games: int, grid: np.ndarray = THRESHOLD_GRID) -> float | None:
    """The most aggressive threshold of `grid` whose false-resignation rate over `games` is
    at most `target`, estimated from at least `min_games` would-be resignations; None when no
    threshold has that much evidence (the caller keeps its current one)."""
    false, would = resignation_counts(games, grid, min_moves)
    ok = (would >= min_games) & (false <= target * would)
    return float(np.asarray(grid)[ok].max()) if ok.any() else None
