import numpy as np
import pytest

from rlscale.zero.games import IllegalMove, make_game
from rlscale.zero.games.base import Game
from rlscale.zero.games.connect4 import Connect4, moves_string, state_from_moves

DRAW = "257771314744647214154617633623313656555222"  # a full board without four in a row


@pytest.fixture
def game():
    return Connect4()


def grid_of(moves):
    """Naive 6x7 grid (row 0 at the bottom): 0 empty, 1/2 the first/second player."""
    grid = np.zeros((6, 7), int)
    for i, ch in enumerate(moves):
        col = int(ch) - 1
        row = int((grid[:, col] != 0).sum())
        grid[row, col] = 1 + i % 2
    return grid


def naive_winner(grid):
    for r in range(6):
        for c in range(7):
            who = grid[r, c]
            if not who:
                continue
            for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                cells = [(r + k * dr, c + k * dc) for k in range(4)]
                if all(0 <= a < 6 and 0 <= b < 7 and grid[a, b] == who for a, b in cells):
                    return who
    return 0


def test_protocol_and_registry(game):
    assert isinstance(game, Game)
    assert isinstance(make_game("connect4"), Connect4)
    state = game.initial_state()
    assert game.num_actions == 7 and game.legal_mask(state).all()
    assert game.planes(state).shape == game.plane_shape == (3, 6, 7)


def test_position_string_round_trip(game):
    state = state_from_moves(game, "4453")
    assert moves_string(state) == "4453"
    assert game.to_play(state) == 0
    assert game.render(state).splitlines()[-2:] == [". . O X X . .", "1 2 3 4 5 6 7"]
    assert game.render(state).splitlines()[-3] == ". . . O . . ."


@pytest.mark.parametrize(
    "moves, result",
    [
        ("1212121", 1.0),  # vertical
        ("1122334", 1.0),  # horizontal
        ("12233434474", 1.0),  # rising diagonal
        ("76655454414", 1.0),  # falling diagonal
        ("71122334", -1.0),  # second player, horizontal
    ],
)
def test_wins(game, moves, result):
    state = state_from_moves(game, moves)
    assert game.is_terminal(state) and game.outcome(state) == result
    assert not game.legal_mask(state).any()
    before = state_from_moves(game, moves[:-1])
    assert not game.is_terminal(before)


def test_draw(game):
    state = state_from_moves(game, DRAW)
    assert naive_winner(grid_of(DRAW)) == 0
    assert game.is_terminal(state) and game.outcome(state) == 0.0
    assert not game.is_terminal(state_from_moves(game, DRAW[:-1]))


def test_bitboards_agree_with_a_naive_board(game):
    rng = np.random.default_rng(0)
    for _ in range(300):
        state = game.initial_state()
        while not game.is_terminal(state):
            legal = np.flatnonzero(game.legal_mask(state))
            heights = (grid_of(state.moves) != 0).sum(axis=0)
            assert legal.tolist() == np.flatnonzero(heights < 6).tolist()
            state = game.apply(state, int(rng.choice(legal)))
        winner = naive_winner(grid_of(state.moves))
        assert game.outcome(state) == {0: 0.0, 1: 1.0, 2: -1.0}[winner]
        assert naive_winner(grid_of(state.moves[:-1])) == 0  # the game stopped at once


def test_illegal_moves(game):
    full = state_from_moves(game, "111111")
    with pytest.raises(IllegalMove, match="column 1 is full"):
        game.apply(full, 0)
    with pytest.raises(IllegalMove, match="full"):
        game.parse_move(full, "1")
    with pytest.raises(IllegalMove, match="0..6"):
        game.apply(full, 7)
    with pytest.raises(IllegalMove, match="over"):
        game.apply(state_from_moves(game, "1212121"), 3)
    for text in ("0", "8", "a", "12", ""):
        with pytest.raises(IllegalMove) as info:
            game.parse_move(full, text)
        assert "\n" not in str(info.value)
    with pytest.raises(IllegalMove, match="move 7 of '1111111'"):
        state_from_moves(game, "1111111")
    with pytest.raises(IllegalMove, match="bad column"):
        state_from_moves(game, "48")


def test_parse_and_format(game):
    state = game.initial_state()
    assert [game.parse_move(state, str(c)) for c in range(1, 8)] == list(range(7))
    assert [game.format_move(state, a) for a in range(7)] == list("1234567")


def test_planes(game):
    state = state_from_moves(game, "4")  # second player to move
    planes = game.planes(state)
    assert planes[0].sum() == 0
    assert planes[1][5, 3] == 1 and planes[1].sum() == 1  # bottom row, centre
    assert (planes[2] == 1).all()
    state = game.apply(state, 3)  # first player to move again
    planes = game.planes(state)
    assert planes[0][5, 3] == 1 and planes[1][4, 3] == 1


def test_mirror_symmetry(game):
    moves = "1123"
    mirrored = "".join(str(8 - int(c)) for c in moves)
    planes = game.planes(state_from_moves(game, moves))
    policy = np.arange(7, dtype=np.float32)
    syms = game.symmetries(planes, policy)
    assert len(syms) == 2
    assert np.array_equal(syms[0][0], planes) and np.array_equal(syms[0][1], policy)
    assert np.array_equal(syms[1][0], game.planes(state_from_moves(game, mirrored)))
    assert syms[1][1].tolist() == policy[::-1].tolist()


def test_states_are_small_values(game):
    a = state_from_moves(game, "4453")
    b = game.apply(state_from_moves(game, "445"), 2)
    assert a == b and hash(a) == hash(b)


def test_bitboard_primitives_match_a_naive_grid(game):
    """has_four, winning_spots and playable (shared by the game, the solver and the playouts)
    against a naive scan of the grid, on random unfinished positions."""
    from rlscale.zero.games.connect4_bitboard import has_four, playable, winning_spots

    def bit(row, col):
        return 1 << (7 * col + row)

    rng = np.random.default_rng(0)
    checked = 0
    while checked < 150:
        state = game.initial_state()
        for _ in range(int(rng.integers(4, 30))):
            legal = np.flatnonzero(game.legal_mask(state))
            after = game.apply(state, int(rng.choice(legal)))
            if game.is_terminal(after):
                break
            state = after
        grid = grid_of(state.moves)
        me = 1 + len(state.moves) % 2
        mine = state.mine
        assert not has_four(mine) and not has_four(mine ^ state.mask)
        spots = 0
        for r in range(6):
            for c in range(7):
                if grid[r, c] == 0:
                    trial = grid.copy()
                    trial[r, c] = me
                    if naive_winner(trial) == me:
                        spots |= bit(r, c)
        assert winning_spots(mine, state.mask) == spots
        tops = [int((grid[:, c] != 0).sum()) for c in range(7)]
        assert playable(state.mask) == sum(bit(h, c) for c, h in enumerate(tops) if h < 6)
        checked += 1
