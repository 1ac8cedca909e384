import json
import math
import re

import numpy as np
import pytest
import torch

from rlscale.zero.agents import FirstLegalAgent, PureMCTSAgent, RandomAgent, SolverAgent
from rlscale.zero.compute_curve import curve_simulations
from rlscale.zero.games import make_game
from rlscale.zero.matches import GameRecord, play_match
from rlscale.zero.network import PolicyValueNet, save_network
from rlscale.zero.perfect_play import (
    GameAudit,
    audit_game,
    audit_match,
    audit_summary,
    audit_table,
    connect4_data_dir,
    solver_agreement,
)
from rlscale.zero.ratings import elo_difference, score_to_elo

HAVE_DATA = (connect4_data_dir() / "Test_L3_R1").is_file()


def _save_tiny(path, game_name, **game_kwargs):
    game = make_game(game_name, **game_kwargs)
    torch.manual_seed(0)
    net = PolicyValueNet(game.plane_shape, game.num_actions, blocks=1, channels=8,
                         value_hidden=8)
    save_network(net, path, game_name, game_kwargs)
    return path


@pytest.fixture(scope="module")
def c4_model(tmp_path_factory):
    return _save_tiny(tmp_path_factory.mktemp("c4") / "model", "connect4")


@pytest.fixture(scope="module")
def ttt_model(tmp_path_factory):
    return _save_tiny(tmp_path_factory.mktemp("ttt") / "model", "tictactoe")


class BatchRecorder(FirstLegalAgent):
    def __init__(self):
        self.name, self.batches = "recorder", []

    def act_many(self, game, states):
        self.batches.append(len(states))
        return super().act_many(game, states)


def test_match_alternates_colours_and_counts():
    game = make_game("tictactoe")
    # Both play the first free cell: the first player always completes the 3-5-7 diagonal.
    result = play_match(game, FirstLegalAgent(), FirstLegalAgent(), 5, opening_plies=0)
    assert (result.wins, result.draws, result.losses) == (3, 0, 2)
    assert result.as_first == [3, 0, 0] and result.as_second == [0, 0, 2]
    assert result.score == pytest.approx(0.6)
    assert sorted(r.a_first for r in result.records) == [False, False, True, True, True]
    assert result.distinct_games == 1  # deterministic agents, no opening: one game replayed
    assert result.summary()["distinct_games"] == 1


def test_match_pairs_share_openings_and_batches_moves():
    game = make_game("connect4")
    a, b = BatchRecorder(), RandomAgent(1)
    result = play_match(game, a, b, 8, seed=3, opening_plies=2)
    assert result.games == 8
    by_opening = {}
    for r in result.records:
        assert len(r.opening) == 2 and r.moves[:2] == r.opening
        by_opening.setdefault(tuple(r.opening), []).append(r.a_first)
    assert all(sorted(v) == [False, True] for v in by_opening.values())
    assert len(by_opening) == 4  # distinct openings
    assert result.distinct_games == 8  # a random opponent: every game differs
    assert max(a.batches) == 8  # all games' moves in one call


def test_elo_difference():
    even = elo_difference(50, 0, 50)
    assert even.elo == 0 and even.low < 0 < even.high
    assert even.low == pytest.approx(-even.high)
    assert elo_difference(30, 40, 30).elo == 0
    assert score_to_elo(0.75) == pytest.approx(400 * math.log10(3))
    lopsided = elo_difference(60, 0, 40)
    assert lopsided.low < lopsided.elo < lopsided.high and lopsided.elo > 0
    perfect = elo_difference(20, 0, 0)
    assert perfect.elo == math.inf and perfect.high == math.inf
    assert 0 < perfect.low < math.inf and str(perfect).startswith(">")
    assert elo_difference(0, 0, 20).elo == -math.inf
    assert json.dumps(perfect.as_dict())  # no inf in JSON


def test_pure_mcts_beats_random():
    c4 = make_game("connect4")
    result = play_match(c4, PureMCTSAgent(200, seed=0), RandomAgent(1), 10, seed=0)
    assert result.wins >= 9
    ttt = make_game("tictactoe")
    result = play_match(ttt, PureMCTSAgent(300, seed=0), RandomAgent(1), 10, seed=0,
                        opening_plies=0)
    assert result.losses == 0 and result.wins >= 6


@pytest.mark.skipif(not HAVE_DATA, reason="no shared/data/connect4")
def test_solver_agreement_perfect_and_random():
    perfect = solver_agreement(SolverAgent(), ["Test_L3_R1"], limit=20)
    assert perfect[0].positions == 20 and perfect[0].share == 1.0
    rand = solver_agreement(RandomAgent(0), ["Test_L3_R1"], limit=20)
    assert rand[0].share < 1.0


def test_curve_simulations():
    assert curve_simulations(800) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 800]
    assert curve_simulations(4) == [0, 1, 2, 4]


def test_move_cli_contract(cli, c4_model):
    result = cli(["move", "--model", str(c4_model), "--moves", "4453", "--simulations", "8"])
    assert result.exit_code == 0
    assert re.fullmatch(r"[1-7]\n", result.stdout)

    lines = "4453\n\n12x\n444444\n"
    result = cli(["move", "--model", str(c4_model), "--moves", "-", "--simulations", "4"],
                 input=lines)
    out = result.stdout.split("\n")
    assert out[-1] == "" and len(out) == 5  # one line per input line
    assert all(re.fullmatch(r"[1-7]", x) for x in (out[0], out[1], out[3]))
    assert out[2] == ""
    assert result.exit_code == 2 and "line 3" in result.stderr

    result = cli(["move", "--model", str(c4_model), "--moves", "4448"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error:") and result.stderr.count("\n") == 1


def test_move_uses_the_play_settings(cli, tmp_path, monkeypatch):
    """`move` searches with the model's saved play settings (play_mcts over its self-play
    search), not the self-play ones; `--search` still forces one."""
    from rlscale.zero.config import MCTSConfig
    from rlscale.zero.model import Model

    selfplay = MCTSConfig(simulations=16, gumbel=True).model_dump()
    play = {"gumbel": False, "c_puct": 3.0}
    game = make_game("connect4")
    net = PolicyValueNet(game.plane_shape, game.num_actions, blocks=1, channels=8,
                         value_hidden=8)
    save_network(net, tmp_path / "m", "connect4", {}, {"mcts": selfplay, "play_mcts": play})
    searched = []
    original = Model.search

    def recording(self, states, simulations=None, game=None):
        searched.append((self.mcts, simulations))
        return original(self, states, simulations, game)

    monkeypatch.setattr(Model, "search", recording)
    result = cli(["move", "--model", str(tmp_path / "m"), "--moves", "44", "--simulations", "5"])
    assert result.exit_code == 0 and re.fullmatch(r"[1-7]\n", result.stdout)
    assert searched == [(MCTSConfig(**{**selfplay, **play}), 5)]
    result = cli(["move", "--model", str(tmp_path / "m"), "--moves", "44", "--simulations", "5",
                  "--search", "gumbel"])
    assert result.exit_code == 0 and searched[-1][0].gumbel and searched[-1][0].c_puct == 3.0


def test_commands_are_one_function_each():
    from rlscale.cli.zero import ARENA_COMMANDS as COMMANDS

    assert set(COMMANDS) == {"arena", "compute-curve", "solver-agreement", "play", "move",
                             "gtp", "elo-curve"}
    assert all(callable(fn) and fn.__doc__ for fn in COMMANDS.values())


def test_cli_errors_are_one_line(cli, c4_model, tmp_path):
    for args in (
        ["arena", "--game", "chess", "--model", str(c4_model)],
        ["arena", "--model", str(tmp_path), "--games", "2"],
        ["arena", "--game", "tictactoe", "--model", str(c4_model), "--games", "2"],
        ["arena", "--model", str(c4_model), "--opponent", "gnugo", "--games", "2"],
        ["move", "--model", str(tmp_path / "nothing"), "--moves", "4"],
    ):
        result = cli(args)
        assert result.exit_code == 2, args
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, args


def test_arena_and_compute_curve_cli(cli, ttt_model, tmp_path):
    result = cli(["arena", "--game", "tictactoe", "--model", str(ttt_model), "--simulations",
                  "4", "--opponent", "random", "--games", "4", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["games"] == 4 and summary["wins"] + summary["draws"] + summary["losses"] == 4

    out = tmp_path / "curve"
    result = cli(["compute-curve", "--game", "tictactoe", "--model", str(ttt_model), "--games",
                  "2", "--simulations", "0,2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "curve.png").stat().st_size > 0
    assert len(json.loads((out / "curve.json").read_text())) == 2


@pytest.mark.skipif(not HAVE_DATA, reason="no shared/data/connect4")
def test_solver_agreement_cli(cli):
    result = cli(["solver-agreement", "--agent", "solver", "--files", "Test_L3_R1",
                  "--limit", "5"])
    assert result.exit_code == 0, result.output
    assert "| overall | 5 | 5 | 100.0% |" in result.stdout


def test_play_cli_scripted(cli, c4_model):
    result = cli(["play", "--model", str(c4_model), "--simulations", "4"],
                 input="9\n4\nquit\n")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.count("illegal move") == 1 and "write a column 1-7" in out
    assert "model plays" in out and out.rstrip().endswith("bye")
    boards = [b for b in out.split("1 2 3 4 5 6 7") if ". X ." in b]
    assert boards  # the human's stone in column 4 after the bad input was refused


def test_gtp_cli_fresh_network(cli):
    result = cli(["gtp", "--simulations", "4"],
                 input="protocol_version\nboardsize 9\ngenmove b\nquit\n")
    assert result.exit_code == 0, result.output
    answers = [a for a in result.stdout.split("\n\n") if a]
    assert answers[0] == "= 2" and answers[1] == "="
    assert re.fullmatch(r"= ([A-HJ][1-9]|pass)", answers[2])


def test_gtp_cli_refuses_wrong_checkpoint(cli, tmp_path, c4_model):
    go7 = _save_tiny(tmp_path / "go7", "go", size=7)
    result = cli(["gtp", "--model", str(go7), "--size", "9"], input="quit\n")
    assert result.exit_code == 2 and "7x7" in result.stderr
    assert result.stderr.count("\n") == 1
    result = cli(["gtp", "--model", str(c4_model)], input="quit\n")
    assert result.exit_code == 2 and "connect4" in result.stderr
    # The right size plays, and refuses a boardsize the model cannot play.
    result = cli(["gtp", "--model", str(go7), "--size", "7", "--simulations", "2"],
                 input="genmove b\nboardsize 9\n")
    answers = [a for a in result.stdout.split("\n\n") if a]
    assert answers[0].startswith("= ") and answers[1] == "? unacceptable size"


def test_network_agent_batched_matches_one_by_one(c4_model):
    from rlscale.zero.agents import load_network_agent

    agent = load_network_agent(c4_model, 0, game="connect4")
    game = make_game("connect4")
    rng = np.random.default_rng(0)
    states = []
    for _ in range(6):
        s = game.initial_state()
        for _ in range(int(rng.integers(6))):
            s = game.apply(s, int(rng.choice(np.flatnonzero(game.legal_mask(s)))))
        states.append(s)
    batched = agent.act_many(game, states)
    assert list(batched) == [agent.act(game, s) for s in states]


def test_compute_curve_plot_with_perfect_and_zero_scores(tmp_path):
    from rlscale.zero.compute_curve import CurvePoint, plot_compute_curve
    from rlscale.zero.matches import MatchResult

    points = [CurvePoint(0, MatchResult("a", "b", wins=16, draws=8, losses=16)),
              CurvePoint(400, MatchResult("a", "b", wins=40)),  # 100%: no finite Elo
              CurvePoint(800, MatchResult("a", "b", losses=40))]  # 0%
    path = plot_compute_curve(points, tmp_path / "curve.png")
    assert path.stat().st_size > 0


def test_audit_game_counts_each_sides_errors():
    # 1212 12: the first mover can win at once in column 1, plays 3 instead, and column 2's
    # stack wins for the second mover.
    record = GameRecord([0, 1, 0, 1, 0, 1], [0, 1, 0, 1, 0, 1, 2, 1], True, -1.0)
    assert audit_game(record) == GameAudit("12121232", start=1, result=-1, a_errors=1,
                                           b_errors=0)
    record.a_first = False
    assert audit_game(record) == GameAudit("12121232", start=-1, result=1, a_errors=0,
                                           b_errors=1)


def test_audit_match_solver_never_errs_against_random():
    c4 = make_game("connect4")
    result = play_match(c4, SolverAgent(0), RandomAgent(1), 8, seed=2, opening_plies=14)
    audits = audit_match(result)
    assert len(audits) == 8
    assert [a.moves for a in audits] == ["".join(str(m + 1) for m in r.moves)
                                         for r in result.records]
    for audit, record in zip(audits, result.records, strict=True):
        assert audit.a_errors == 0  # perfect play never lowers its own value
        assert audit.result >= audit.start
        assert audit.result == (1 if record.a_score == 1 else 0 if record.a_score == 0.5 else -1)
        if audit.result > audit.start:
            assert audit.b_errors > 0  # it gained: the random side threw something away
    rows = audit_summary(audits)
    assert sum(r["games"] for r in rows) == 8
    assert sum(r["wins"] for r in rows) == result.wins
    assert sum(r["losses"] for r in rows) == result.losses == 0
    assert "| won |" in audit_table(audits)


def test_arena_audit_cli(cli, c4_model):
    result = cli(["arena", "--model", str(c4_model), "--simulations", "2", "--opponent",
                  "random", "--games", "2", "--opening-plies", "16", "--audit", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert sum(r["games"] for r in summary["audit"]) == 2
    assert len(summary["audit_games"]) == 2
    result = cli(["arena", "--game", "tictactoe", "--model", str(c4_model), "--audit"])
    assert result.exit_code == 2 and "--audit" in result.stderr
    assert result.stderr.count("\n") == 1


def test_engines_take_one_thread_unless_told(cli, c4_model):
    """`move` and `gtp` run beside other programs: one torch thread by default (issue 48:
    with every core, a game beside other jobs took 20x longer)."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert cli(["move", "--model", str(c4_model), "--moves", "44",
                    "--simulations", "2"]).exit_code == 0
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        assert cli(["move", "--model", str(c4_model), "--moves", "44", "--simulations", "2",
                    "--threads", "0"]).exit_code == 0
        assert torch.get_num_threads() == 2
        result = cli(["gtp", "--threads", "1"], input="name\nquit\n")
        assert result.exit_code == 0 and "= rlscale" in result.stdout
    finally:
        torch.set_num_threads(before)
