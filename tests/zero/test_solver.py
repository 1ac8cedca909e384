from pathlib import Path

import pytest

from rlscale.zero.games import IllegalMove
from rlscale.zero.games.connect4 import Connect4, state_from_moves
from rlscale.zero.solver import Solver, best_moves, move_values, solve, wdl

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "connect4"


def sample(name, every):
    path = DATA / name
    if not path.exists():
        pytest.skip(f"benchmark positions not found at {path} (shared/ beside the checkout)")
    lines = path.read_text().split("\n")
    rows = [line.split() for line in lines if line.strip()]
    return [(moves, int(score)) for moves, score in rows[::every]]


@pytest.fixture(scope="module")
def solver():
    return Solver(tt_bits=20)


@pytest.mark.parametrize(
    "name, every",
    [("Test_L3_R1", 10), ("Test_L2_R1", 10), ("Test_L2_R2", 10), ("Test_L1_R1", 10)],
)
def test_scores_match_the_benchmark_files(solver, name, every):
    positions = sample(name, every)
    assert len(positions) == 100
    wrong = [(moves, score, solver.solve(moves)) for moves, score in positions]
    wrong = [row for row in wrong if row[1] != row[2]]
    assert not wrong, f"{len(wrong)} wrong, e.g. {wrong[:3]}"


def test_known_positions(solver):
    # From the benchmark's definition: red wins with its 4th stone; red wins next move
    # with its 7th stone.
    assert solver.solve("4455") == 18
    assert solver.solve("44455554221") == -15
    assert solve("121212") == 18  # wins at once, with its 4th stone
    assert solve("1212123") == 18  # the other side wins at once, with its 4th stone


def test_move_values_and_best_moves(solver):
    game = Connect4()
    for moves, score in sample("Test_L3_R1", 100):
        values = solver.move_values(moves)
        state = state_from_moves(game, moves)
        assert [v is None for v in values] == [not ok for ok in game.legal_mask(state)]
        assert max(v for v in values if v is not None) == score
        best = solver.best_moves(moves)
        assert best and all(values[c] == score for c in best)
        # weak values keep the sign
        weak = solver.move_values(moves, weak=True)
        assert weak == [None if v is None else wdl(v) for v in values]
        assert solver.solve(moves, weak=True) == wdl(score)
    late = "7422341735647741166133573473242566"
    assert move_values(late) == [-3, 1, None, None, -4, 1, None]
    assert best_moves(late) == [1, 5]
    last = late + "226115"  # only column 5 is open, and it wins with the last stone
    assert move_values(last) == [None, None, None, None, 1, None, None]


def test_wdl():
    assert [wdl(s) for s in (-3, 0, 5)] == [-1, 0, 1]


def test_bad_positions(solver):
    with pytest.raises(IllegalMove, match="over"):
        solver.solve("1212121")
    with pytest.raises(IllegalMove, match="full"):
        solver.solve("1111111")
    with pytest.raises(IllegalMove):
        solver.solve("489")
