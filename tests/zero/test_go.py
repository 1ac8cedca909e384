import pickle
import time

import numpy as np
import pytest

from rlscale.zero.games import IllegalMove, make_game
from rlscale.zero.games.base import Game
from rlscale.zero.games.go import Go, action_to_gtp, gtp_to_action, random_move, result_string

EMPTY_ROWS = ". . . . . . . . .\n" * 5

# Two kos: black can take the white stone at B9 by C9, white the black stone at B1 by C1.
DOUBLE_KO = (
    "X O . O . . . . .\n"
    ". X O . . . . . .\n" + EMPTY_ROWS +
    ". O X . . . . . .\n"
    "O X . X . . . . .\n"
)


@pytest.fixture(scope="module")
def game():
    return Go(9)


def play(game, state, moves):
    """Apply space-separated GTP moves, alternating from the side to move."""
    for move in moves.split():
        state = game.apply(state, gtp_to_action(game.size, move))
    return state


def stone(game, state, vertex):
    return game.stone_at(state, gtp_to_action(game.size, vertex))


def test_protocol_and_registry(game):
    assert isinstance(game, Game)
    go = make_game("go", size=13, komi=6.5)
    assert (go.size, go.komi, go.num_actions) == (13, 6.5, 170)
    assert make_game("go").size == 9 and make_game("go").komi == 7.5
    for bad in (4, 20):
        with pytest.raises(ValueError, match="5..19"):
            make_game("go", size=bad)
    with pytest.raises(ValueError, match="no option 'colour'"):
        make_game("go", colour="black")
    state = game.initial_state()
    assert game.to_play(state) == 0 and game.legal_mask(state).all()
    assert game.planes(state).shape == game.plane_shape == (4, 9, 9)


def test_capture_single_stone(game):
    state = play(game, game.initial_state(), "D5 E5 E4 A1 E6 A2 F5")
    assert stone(game, state, "E5") == 0
    assert all(stone(game, state, v) == 1 for v in ("D5", "E4", "E6", "F5"))
    # The captured point is now an eye-like empty point: white may not play there (suicide).
    with pytest.raises(IllegalMove, match="E5 is suicide"):
        game.apply(state, gtp_to_action(9, "E5"))


def test_capture_group_at_the_edge(game):
    state = play(game, game.initial_state(), "A2 A1 B2 B1 C1")
    assert stone(game, state, "A1") == 0 and stone(game, state, "B1") == 0
    assert game.legal_mask(state)[gtp_to_action(9, "A1")]  # white may play back in


def test_simple_ko(game):
    p0 = game.from_diagram(DOUBLE_KO, to_play=0)
    taken = play(game, p0, "C9")
    assert stone(game, taken, "B9") == 0 and stone(game, taken, "C9") == 1
    b9 = gtp_to_action(9, "B9")
    assert not game.legal_mask(taken)[b9]
    with pytest.raises(IllegalMove, match="superko"):
        game.apply(taken, b9)
    later = play(game, taken, "E5 E6")  # a ko threat and its answer
    assert game.legal_mask(later)[b9]
    retaken = game.apply(later, b9)
    assert stone(game, retaken, "C9") == 0 and stone(game, retaken, "B9") == 2


def test_positional_superko_cycle(game):
    """Double ko: each capture is allowed by the simple ko rule, but after
    B C9, W C1, B pass, W B9 the recapture B1 recreates the first position."""
    p0 = game.from_diagram(DOUBLE_KO, to_play=0)
    state = play(game, p0, "C9 C1 pass B9")
    b1 = gtp_to_action(9, "B1")
    assert not game.legal_mask(state)[b1]
    assert game.illegal_reason(state, b1) == "B1 repeats an earlier position (superko)"
    with pytest.raises(IllegalMove, match="superko"):
        game.parse_move(state, "B1")
    # The same board without that history allows it: the rule looks at the history.
    fresh = game.from_diagram(_board_rows(game, state), to_play=0)
    after = game.apply(fresh, b1)
    assert np.array_equal(after.board, p0.board)


def _board_rows(game, state):
    n = game.size
    return "\n".join("".join(".XO"[v] for v in state.board[r * n : (r + 1) * n]) for r in range(n))


def test_suicide_single_and_multi_stone(game):
    rows = [". X . . . . . . .", "X . . . . . . . ."] + [". . . . . . . . ."] * 7
    corner = game.from_diagram("\n".join(rows), to_play=1)
    a9 = gtp_to_action(9, "A9")
    assert not game.legal_mask(corner)[a9]
    with pytest.raises(IllegalMove, match="A9 is suicide"):
        game.apply(corner, a9)
    assert game.legal_mask(game.set_to_play(corner, 0))[a9]  # filling one's own eye is legal

    rows = ["O O . X . . . . .", "X X X . . . . . ."] + [". . . . . . . . ."] * 7
    multi = game.from_diagram("\n".join(rows), to_play=1)
    c9 = gtp_to_action(9, "C9")
    assert not game.legal_mask(multi)[c9]
    with pytest.raises(IllegalMove, match="C9 is suicide"):
        game.apply(multi, c9)


def test_capture_comes_before_suicide(game):
    rows = ["O O . X O . . . .", "X X X O . . . . ."] + [". . . . . . . . ."] * 7
    state = game.from_diagram("\n".join(rows), to_play=1)
    c9 = gtp_to_action(9, "C9")
    assert game.legal_mask(state)[c9]
    after = game.apply(state, c9)
    assert stone(game, after, "D9") == 0
    assert [stone(game, after, v) for v in ("A9", "B9", "C9")] == [2, 2, 2]


def test_tromp_taylor_scoring():
    go = Go(5, komi=7.5)
    walls = go.from_diagram("\n".join([". . X O ."] * 5))
    assert go.area(walls) == (15, 10)
    assert go.score(walls) == -2.5 and result_string(go.score(walls)) == "W+2.5"
    assert go.outcome(walls) == -1.0
    dame = Go(5, komi=0).from_diagram("\n".join([". X . O ."] * 5))
    assert Go(5, komi=0).area(dame) == (10, 10)  # the middle column touches both colours
    assert Go(5, komi=0).outcome(dame) == 0.0 and result_string(0.0) == "0"
    black = Go(5, komi=0.5).from_diagram("\n".join([". X . . ."] * 5))
    assert Go(5, komi=0.5).score(black) == 24.5 and result_string(24.5) == "B+24.5"
    assert result_string(-3.0) == "W+3"


def test_passes_and_move_cap(game):
    state = play(game, game.initial_state(), "pass")
    assert not game.is_terminal(state) and game.to_play(state) == 1
    state = play(game, state, "E5 pass")
    assert not game.is_terminal(state)
    state = play(game, state, "pass")
    assert game.is_terminal(state)
    assert not game.legal_mask(state).any()
    with pytest.raises(IllegalMove, match="over"):
        game.apply(state, game.pass_action)
    assert game.outcome(state) == -1.0  # white (E5) owns the whole board
    capped = Go(5, max_moves=3)
    state = play(capped, capped.initial_state(), "A1 B2 pass")
    assert capped.is_terminal(state) and capped.outcome(state) == -1.0  # 1 - 1 - 7.5


def test_parse_and_format(game):
    state = game.initial_state()
    assert game.parse_move(state, "D4") == (9 - 4) * 9 + 3
    assert game.parse_move(state, "a9") == 0 and game.parse_move(state, " J1 ") == 80
    assert game.parse_move(state, "PASS") == game.pass_action
    for action in range(game.num_actions):
        assert game.parse_move(state, game.format_move(state, action)) == action
    assert game.format_move(state, 81) == "pass" and game.format_move(state, 8) == "J9"
    for text, match in [("I5", "bad"), ("Z1", "bad"), ("K1", "off the 9x9"), ("A10", "off"),
                        ("A0", "off"), ("", "bad"), ("D", "bad"), ("4D", "bad")]:
        with pytest.raises(IllegalMove, match=match) as info:
            game.parse_move(state, text)
        assert "\n" not in str(info.value)
    occupied = play(game, state, "D4")
    with pytest.raises(IllegalMove, match="D4 is occupied"):
        game.parse_move(occupied, "d4")
    with pytest.raises(IllegalMove):
        game.format_move(state, 82)
    assert action_to_gtp(19, 0) == "A19" and gtp_to_action(19, "T1") == 360


def test_planes_and_history():
    go = Go(5, history=2)
    assert go.plane_shape == (8, 5, 5)
    s0 = go.initial_state()
    s1 = play(go, s0, "A1")
    s2 = play(go, s1, "B1")
    planes = go.planes(s2)  # black to move
    a1, b1 = divmod(gtp_to_action(5, "A1"), 5), divmod(gtp_to_action(5, "B1"), 5)
    assert planes[0][a1] == 1 and planes[1][b1] == 1 and planes[0].sum() == planes[1].sum() == 1
    assert planes[2][a1] == 1 and planes[3].sum() == 0  # one move ago: only A1
    assert planes[4].sum() == 0 and planes[5].sum() == 0  # two moves ago: empty
    assert (planes[6] == 1).all() and (planes[7] == 1).all()  # black to move, ones
    white = go.planes(s1)
    assert white[1][a1] == 1 and white[0].sum() == 0 and (white[6] == 0).all()


def random_moves(game, count, seed):
    rng = np.random.default_rng(seed)
    state, actions = game.initial_state(), []
    for _ in range(count):
        action = random_move(game, state, rng)
        actions.append(action)
        state = game.apply(state, action)
    return state, actions


def symmetry_maps(game):
    """For each of the 8 symmetries, `to`: the action a becomes to[a] (pass stays pass)."""
    index = np.arange(game.num_actions)
    maps = []
    for _, where_from in game.symmetries(np.zeros(game.plane_shape, np.float32), index):
        to = np.empty_like(where_from)
        to[where_from] = index
        maps.append(to)
    return maps


@pytest.mark.parametrize("go", [Go(9), Go(7, komi=9, history=2)], ids=["9x9", "7x7-history"])
def test_symmetries_are_consistent_with_the_rules(go):
    state, actions = random_moves(go, 15, seed=1)
    rng = np.random.default_rng(1)
    planes = go.planes(state)
    policy = rng.random(go.num_actions).astype(np.float32)
    syms = go.symmetries(planes, policy)
    assert len(syms) == 8
    assert np.array_equal(syms[0][0], planes) and np.array_equal(syms[0][1], policy)
    index = np.arange(go.num_actions)
    for (sym_planes, sym_policy), to in zip(syms, symmetry_maps(go), strict=True):
        assert to[-1] == go.pass_action and sym_policy[-1] == policy[-1]
        assert sorted(to.tolist()) == index.tolist()  # a permutation
        replayed = go.initial_state()
        for action in actions:  # the transformed game: every move transformed
            replayed = go.apply(replayed, int(to[action]))
        # planes (history planes included), legal moves and score all follow the moves
        assert np.array_equal(go.planes(replayed), sym_planes)
        assert np.array_equal(go.legal_mask(replayed)[to], go.legal_mask(state))
        assert go.score(replayed) == go.score(state)
        assert np.allclose(sym_policy[to], policy)


def symmetrised(game, net):
    """The network averaged over the 8 symmetries: equivariant by construction, if the
    symmetries map planes and moves consistently."""
    maps = symmetry_maps(game)
    dummy = np.zeros(game.num_actions, np.float32)

    def evaluate(planes):
        priors, values = 0.0, 0.0
        for k, to in enumerate(maps):
            moved = np.stack([game.symmetries(p, dummy)[k][0] for p in planes])
            prior, value = net.evaluate(moved)
            priors, values = priors + prior[:, to], values + value  # back to the input's frame
        return (priors / len(maps)).astype(np.float32), (values / len(maps)).astype(np.float32)

    return evaluate


def test_a_position_and_its_transform_get_transformed_policies():
    import torch

    from rlscale.zero.config import MCTSConfig, NetworkConfig
    from rlscale.zero.network import network_for
    from rlscale.zero.search import search_states

    go = Go(7, komi=9, history=1)
    torch.manual_seed(0)
    net = network_for(go, NetworkConfig(blocks=1, channels=8, value_hidden=8))
    evaluate = symmetrised(go, net)
    state, actions = random_moves(go, 12, seed=4)
    transformed = []
    for to in symmetry_maps(go):
        moved = go.initial_state()
        for action in actions:
            moved = go.apply(moved, int(to[action]))
        transformed.append(moved)
    prior, value = evaluate(np.stack([go.planes(s) for s in [state] + transformed]))
    raw, _ = net.evaluate(np.stack([go.planes(s) for s in transformed]))
    assert not np.allclose(raw[1][symmetry_maps(go)[1]], raw[0], atol=1e-3)  # net alone: not
    search = MCTSConfig(simulations=64, c_puct=1.25)
    result = search_states(go, [state] + transformed, evaluate, search,
                           np.random.default_rng(0))
    for k, to in enumerate(symmetry_maps(go)):
        assert np.allclose(prior[1 + k][to], prior[0], atol=1e-5)
        assert abs(value[1 + k] - value[0]) < 1e-5
        # the search's training target of the transformed position is the transformed target
        assert np.array_equal(result.visit_counts[1 + k][to], result.visit_counts[0])
        assert np.allclose(result.policy[1 + k][to], result.policy[0])
        # the move: the transformed one, up to ties between the most visited (lowest index)
        counts = result.visit_counts[1 + k]
        assert counts[to[result.chosen[0]]] == counts[result.chosen[1 + k]] == counts.max()


def naive_apply(board, size, point, colour):
    """Place a stone and remove captured groups with a plain flood fill (no legality)."""
    board = board.copy().reshape(size, size)
    r, c = divmod(point, size)
    board[r, c] = colour

    def group(r, c):
        colour, seen, stack, libs = board[r, c], {(r, c)}, [(r, c)], 0
        while stack:
            a, b = stack.pop()
            for x, y in ((a - 1, b), (a + 1, b), (a, b - 1), (a, b + 1)):
                if 0 <= x < size and 0 <= y < size and (x, y) not in seen:
                    if board[x, y] == 0:
                        libs += 1
                    elif board[x, y] == colour:
                        seen.add((x, y))
                        stack.append((x, y))
        return seen, libs

    for x, y in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
        if 0 <= x < size and 0 <= y < size and board[x, y] == 3 - colour:
            stones, libs = group(x, y)
            if libs == 0:
                for a, b in stones:
                    board[a, b] = 0
    return board.reshape(-1), group(r, c)[1] > 0


def test_random_games_against_a_naive_board():
    go = Go(7)
    rng = np.random.default_rng(7)
    for _ in range(6):
        state = go.initial_state()
        positions = {state.board.tobytes()}
        while not go.is_terminal(state):
            legal = go.legal_mask(state)
            if state.moves % 5 == 0:
                for action in range(go.num_actions):
                    assert legal[action] == (go.illegal_reason(state, action) is None)
            for point in np.flatnonzero(state.board == 0)[:: 3]:
                board, breathes = naive_apply(state.board, 7, point, state.to_play + 1)
                expected = breathes and board.tobytes() not in positions
                assert legal[point] == expected
            action = random_move(go, state, rng) if rng.random() < 0.9 else int(
                rng.choice(np.flatnonzero(legal)))
            if action != go.pass_action:
                expected, _ = naive_apply(state.board, 7, action, state.to_play + 1)
            state = go.apply(state, action)
            if action != go.pass_action:
                assert np.array_equal(state.board, expected)
            positions.add(state.board.tobytes())
            assert not state.board.flags.writeable


def test_random_mover_and_speed(game):
    # Black's two eyes: black only has eye fills (legal, but the mover passes), white nothing.
    rows = ["X X X X X"] * 5
    rows[0], rows[4] = ". X X X X", "X X X X ."
    go = Go(5)
    full = go.from_diagram("\n".join(rows))
    assert go.legal_mask(full)[[0, 24, 25]].all() and go.legal_mask(full).sum() == 3
    assert random_move(go, full) == go.pass_action
    assert go.legal_mask(go.set_to_play(full, 1)).tolist() == [False] * 25 + [True]
    rng = np.random.default_rng(0)
    play_random_game(game, rng)  # compile/load kernels
    start = time.process_time()  # CPU time: other processes on the machine do not count
    lengths = [play_random_game(game, rng) for _ in range(5)]
    per_game = (time.process_time() - start) / 5
    assert per_game < 0.05, f"a random 9x9 game took {per_game * 1e3:.1f} ms of CPU"
    assert min(lengths) > 40


def play_random_game(game, rng):
    state = game.initial_state()
    while not game.is_terminal(state):
        state = game.apply(state, random_move(game, state, rng))
        game.planes(state)
    return state.moves


def test_render_and_state_values(game):
    state = play(game, game.initial_state(), "A9 J1")
    text = game.render(state)
    assert text.splitlines()[1].startswith(" 9 X") and text.splitlines()[9].endswith("O  1")
    again = play(game, game.initial_state(), "A9 J1")
    assert again == state and hash(again) == hash(state)
    assert not state.board.flags.writeable
    copy = pickle.loads(pickle.dumps(state))
    assert copy == state and not copy.board.flags.writeable and not copy.seen.flags.writeable
    assert game.legal_mask(copy).tolist() == game.legal_mask(state).tolist()
    with pytest.raises(ValueError, match="no liberty"):
        rows = ["X O . . . . . . .", "O . . . . . . . ."] + [". . . . . . . . ."] * 7
        game.from_diagram("\n".join(rows))
