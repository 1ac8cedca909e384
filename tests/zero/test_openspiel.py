import numpy as np
import pytest

from rlscale.zero.games import IllegalMove, make_game
from rlscale.zero.games.base import Game

pytest.importorskip("pyspiel", reason="OpenSpiel not installed (pip install 'rlscale[openspiel]')")


def test_connect_four_through_the_protocol():
    game = make_game("openspiel:connect_four")
    assert isinstance(game, Game)
    assert game.name == "openspiel:connect_four" and game.num_actions == 7
    assert game.plane_shape == (3, 6, 7)
    state = game.initial_state()
    assert game.to_play(state) == 0 and game.legal_mask(state).all()
    assert game.planes(state).shape == game.plane_shape
    for column in [0, 1, 0, 1, 0, 1]:
        state = game.apply(state, column)
    assert game.to_play(state) == 0 and not game.is_terminal(state)
    won = game.apply(state, 0)
    assert game.is_terminal(won) and game.outcome(won) == 1.0
    assert not game.legal_mask(won).any()
    with pytest.raises(IllegalMove, match="over"):
        game.apply(won, 2)
    # apply never mutates its input
    assert not game.is_terminal(state) and game.legal_mask(state).all()


def test_moves_and_errors():
    game = make_game("openspiel:tic_tac_toe")
    state = game.initial_state()
    text = game.format_move(state, 4)
    assert game.parse_move(state, text) == 4 and game.parse_move(state, "4") == 4
    state = game.apply(state, 4)
    with pytest.raises(IllegalMove, match="not legal"):
        game.apply(state, 4)
    with pytest.raises(IllegalMove):
        game.parse_move(state, "nonsense")
    assert game.symmetries(game.planes(state), np.ones(9))[0][0].shape == game.plane_shape
    with pytest.raises(ValueError, match="does not fit"):
        make_game("openspiel:kuhn_poker")
    with pytest.raises(ValueError, match="unknown OpenSpiel game 'no_such_game'"):
        make_game("openspiel:no_such_game")
    with pytest.raises(ValueError, match="cannot load"):  # a known game, a parameter it lacks
        make_game("openspiel:tic_tac_toe", no_such_parameter=3)
