import numpy as np
import pytest

from rlscale.zero.games import IllegalMove, make_game
from rlscale.zero.games.base import Game
from rlscale.zero.games.tictactoe import (
    TicTacToe,
    TicTacToeState,
    losses_to_minimax,
    minimax_value,
    optimal_moves,
    reachable_positions,
)


@pytest.fixture
def game():
    return TicTacToe()


def play(game, moves):
    state = game.initial_state()
    for move in moves:
        state = game.apply(state, move)
    return state


def test_protocol_and_registry(game):
    assert isinstance(game, Game)
    assert isinstance(make_game("tictactoe"), TicTacToe)
    state = game.initial_state()
    assert game.to_play(state) == 0
    assert game.legal_mask(state).tolist() == [True] * 9
    assert game.planes(state).shape == game.plane_shape


def test_game_tree_counts(game):
    """The well-known counts: 5478 positions, 255168 games (131184 X wins, 77904 O wins,
    46080 draws), and a draw under perfect play."""
    positions = set()
    games = {}  # state -> (x wins, o wins, draws) over all games from it
    value = {}

    def walk(state):
        if state in games:
            return games[state]
        positions.add(state)
        if game.is_terminal(state):
            result = game.outcome(state)
            games[state] = (int(result > 0), int(result < 0), int(result == 0))
            value[state] = result
            return games[state]
        totals = np.zeros(3, int)
        child_values = []
        for action in np.flatnonzero(game.legal_mask(state)):
            child = game.apply(state, int(action))
            totals += walk(child)
            child_values.append(value[child])
        games[state] = tuple(totals)
        value[state] = max(child_values) if game.to_play(state) == 0 else min(child_values)
        return games[state]

    start = game.initial_state()
    assert walk(start) == (131184, 77904, 46080)
    assert len(positions) == 5478
    assert value[start] == 0


def test_wins_and_outcome(game):
    row = play(game, [0, 3, 1, 4, 2])
    assert game.is_terminal(row) and game.outcome(row) == 1.0
    assert not game.legal_mask(row).any()
    column = play(game, [0, 1, 3, 2, 8, 4, 5, 7])  # O: 1, 4, 7
    assert game.is_terminal(column) and game.outcome(column) == -1.0
    diagonal = play(game, [2, 0, 4, 1, 6])
    assert game.outcome(diagonal) == 1.0
    draw = play(game, [0, 4, 8, 1, 7, 6, 2, 5, 3])
    assert game.is_terminal(draw) and game.outcome(draw) == 0.0


def test_illegal_moves(game):
    state = play(game, [4])
    with pytest.raises(IllegalMove, match="taken"):
        game.apply(state, 4)
    with pytest.raises(IllegalMove, match="0..8"):
        game.apply(state, 9)
    over = play(game, [0, 3, 1, 4, 2])
    with pytest.raises(IllegalMove, match="over"):
        game.apply(over, 8)
    for err_text in ("d1", "0", "10", "a4", ""):
        with pytest.raises(IllegalMove) as info:
            game.parse_move(state, err_text)
        assert "\n" not in str(info.value)


def test_parse_and_format(game):
    state = game.initial_state()
    assert game.parse_move(state, "1") == 0
    assert game.parse_move(state, " 9 ") == 8
    assert game.parse_move(state, "a1") == 0
    assert game.parse_move(state, "B2") == 4
    assert game.parse_move(state, "c1") == 2
    assert game.parse_move(state, "a3") == 6
    assert [game.format_move(state, a) for a in range(9)] == list("123456789")
    with pytest.raises(IllegalMove, match="taken"):
        game.parse_move(play(game, [4]), "b2")


def test_planes_from_the_mover(game):
    state = play(game, [4])  # X in the centre, O to move
    planes = game.planes(state)
    assert planes[0].sum() == 0 and planes[1][1, 1] == 1 and planes[1].sum() == 1
    assert (planes[2] == 1).all()
    state = game.apply(state, 0)  # X to move: own = X
    planes = game.planes(state)
    assert planes[0][1, 1] == 1 and planes[1][0, 0] == 1


def test_symmetries_permute_policy_with_planes(game):
    state = play(game, [1, 5])
    planes = game.planes(state)
    policy = np.zeros(9, np.float32)
    policy[1] = 1.0  # on the X stone
    syms = game.symmetries(planes, policy)
    assert len(syms) == 8
    assert np.array_equal(syms[0][0], planes) and np.array_equal(syms[0][1], policy)
    seen = set()
    for sym_planes, sym_policy in syms:
        assert sym_planes.shape == planes.shape
        # The X stone (own plane: X to move) lands where the policy mass lands.
        assert np.flatnonzero(sym_planes[0].reshape(-1)).tolist() == [int(np.argmax(sym_policy))]
        seen.add(sym_planes.tobytes())
    assert len(seen) == 8


def test_states_are_small_values(game):
    a = play(game, [0, 4])
    b = play(game, [0, 4])
    assert a == b and hash(a) == hash(b) and isinstance(a, TicTacToeState)
    assert "X" in game.render(a) and "O" in game.render(a)


def test_exact_solution_of_the_whole_game():
    game = TicTacToe()
    positions = reachable_positions()
    assert len(positions) == len(set(positions)) == 4520  # 5,478 less the 958 finished ones
    assert minimax_value(game.initial_state()) == 0  # perfect play draws
    # X on 1 and 2, O on 4 and 5, X to move: 3 wins at once, nothing else does
    state = game.initial_state()
    for cell in (0, 3, 1, 4):
        state = game.apply(state, cell)
    assert minimax_value(state) == 1 and optimal_moves(state) == [2]
    # a perfect player never loses to a perfect player; the first legal cell loses often
    perfect = lambda s: optimal_moves(s)[0]  # noqa: E731
    first_cell = lambda s: int(np.flatnonzero(game.legal_mask(s))[0])  # noqa: E731
    assert losses_to_minimax(perfect, 0)[0] == losses_to_minimax(perfect, 1)[0] == 0
    lost, games = losses_to_minimax(first_cell, 1)
    assert 0 < lost <= games
