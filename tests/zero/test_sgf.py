import numpy as np
import pytest

from rlscale.zero.games.go import Go, gtp_to_action, random_move, result_string
from rlscale.zero.sgf import from_sgf, replay, to_sgf, write_sgf


def test_round_trip_of_a_random_game(tmp_path):
    game = Go(9, komi=7.5)
    rng = np.random.default_rng(3)
    state = game.initial_state()
    actions = []
    while not game.is_terminal(state):
        action = random_move(game, state, rng)
        actions.append(action)
        state = game.apply(state, action)
    result = result_string(game.score(state))
    text = to_sgf(9, 7.5, actions, result=result, black="rl]scale\\", white="random")
    assert text.startswith("(;GM[1]FF[4]") and "SZ[9]KM[7.5]" in text and f"RE[{result}]" in text
    assert "PB[rl\\]scale\\\\]" in text
    assert text.count(";B[") + text.count(";W[") == len(actions)
    assert ";B[]" in text or ";W[]" in text  # the game ended with passes
    record = from_sgf(text)
    assert (record.size, record.komi, record.result) == (9, 7.5, result)
    assert record.black == "rl]scale\\" and record.white == "random"
    assert record.moves == [(i % 2, a) for i, a in enumerate(actions)]
    final = replay(game, record.moves)[-1]
    assert np.array_equal(final.board, state.board)
    path = tmp_path / "game.sgf"
    write_sgf(path, 9, 7.5, actions, result=result)
    assert from_sgf(path.read_text()).moves == record.moves


def test_coordinates_and_explicit_colours():
    text = to_sgf(9, 6.5, [(0, gtp_to_action(9, "A9")), (0, gtp_to_action(9, "J1")), (1, 81)])
    assert ";B[aa];B[ii];W[]" in text
    assert from_sgf(text).moves == [(0, 0), (0, 80), (1, 81)]


def test_reads_a_hand_written_record():
    text = """(;GM[1]FF[4]SZ[5]KM[0.5]RE[W+R]PW[Someone]C[a comment with \\] and a soft\\
break]
    ;B[cc](;W[dd];B[tt]
    ;W[])(;W[bb]))"""
    record = from_sgf(text)
    assert record.size == 5 and record.komi == 0.5 and record.result == "W+R"
    assert record.moves == [(0, 12), (1, 18), (0, 25), (1, 25)]  # main line only
    assert record.properties["C"] == "a comment with ] and a softbreak"


@pytest.mark.parametrize(
    "text, match",
    [
        ("(;GM[2]SZ[9])", "not Go"),
        ("(;GM[1]SZ[9]AB[aa])", "setup"),
        ("(;GM[1]SZ[9];B[zz])", "off the 9x9"),
        ("(;GM[1]SZ[9];B[aa]", "not closed"),
        ("GM[1]", "must start"),
    ],
)
def test_bad_records(text, match):
    with pytest.raises(ValueError, match=match):
        from_sgf(text)
