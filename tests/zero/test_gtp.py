import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlscale.zero.games.go import Go, action_to_gtp
from rlscale.zero.gtp import COMMANDS, GtpEngine, random_engine

GNUGO = shutil.which("gnugo") or ("/usr/games/gnugo" if Path("/usr/games/gnugo").exists() else None)


def ask(engine, command):
    """(ok, text) of one command sent to an in-process engine."""
    response = engine.handle(command)
    assert response.endswith("\n\n") and "\n\n" not in response[:-2]
    status, _, text = response[:-2].partition(" ")
    assert status[0] in "=?"
    return status[0] == "=", text


@pytest.fixture
def engine():
    return random_engine(seed=0)


def test_identity_commands(engine):
    assert engine.handle("protocol_version") == "= 2\n\n"
    assert engine.handle("12 name") == "=12 rlscale\n\n"
    assert ask(engine, "version")[1] == engine.version
    assert engine.handle("known_command genmove") == "= true\n\n"
    assert engine.handle("3 known_command fly") == "=3 false\n\n"
    listed = engine.handle("list_commands")[2:-2].split("\n")
    assert listed == list(COMMANDS)


def test_errors_and_input_cleaning(engine):
    assert engine.handle("fly") == "? unknown command\n\n"
    assert engine.handle("7 fly") == "?7 unknown command\n\n"
    assert engine.handle("") is None and engine.handle("   # only a comment") is None
    assert engine.handle(" \t name   # trailing comment\r\n") == "= rlscale\n\n"
    assert engine.handle("na\x01me") == "= rlscale\n\n"
    assert engine.handle("boardsize 4") == "? unacceptable size\n\n"
    assert engine.handle("boardsize 20") == "? unacceptable size\n\n"
    assert ask(engine, "boardsize x")[1].startswith("syntax error")
    assert ask(engine, "komi abc")[1].startswith("syntax error")
    assert ask(engine, "play b")[1].startswith("syntax error")
    assert ask(engine, "play red D4")[1].startswith("syntax error")
    assert ask(engine, "play b Z9")[1].startswith("syntax error")
    assert ask(engine, "play b K9")[1] == "syntax error: K9 is off the 9x9 board"
    assert engine.handle("undo") == "? cannot undo\n\n"


def test_play_genmove_undo_and_showboard(engine):
    assert ask(engine, "play b D4") == (True, "")
    assert ask(engine, "play w d4") == (False, "illegal move: D4 is occupied")
    assert ask(engine, "play b E5") == (True, "")  # either colour may play at any time
    ok, vertex = ask(engine, "genmove w")
    assert ok and re.fullmatch(r"[A-HJ]\d", vertex)
    board = ask(engine, "showboard")[1]
    assert board.startswith("\n") and len(board.strip().splitlines()) == 12
    assert board.count("X") == 2 and board.count("O") == 1
    assert ask(engine, "undo") == (True, "")
    assert ask(engine, "showboard")[1].count("O") == 0
    assert ask(engine, "clear_board") == (True, "")
    assert ask(engine, "showboard")[1].count("X") == 0
    assert ask(engine, "boardsize 13") == (True, "")
    assert ask(engine, "play w N13") == (True, "")
    assert engine.game.size == 13 and len(engine.moves) == 1


def test_captures_and_suicide(engine):
    # Black A8 and B9 share their last liberty A9: white A9 captures both.
    for command in ["b A8", "b B9", "w A7", "w B8", "w C9"]:
        assert ask(engine, f"play {command}") == (True, "")
    assert ask(engine, "play w A9") == (True, "")
    assert ask(engine, "showboard")[1].count("X") == 0
    # B9 is now surrounded by white stones that keep a liberty (A8): suicide.
    assert ask(engine, "play b B9") == (False, "illegal move: B9 is suicide")


def test_simple_ko_via_gtp(engine):
    for command in ["b B9", "b C8", "w C9", "w D8", "w E9", "b A9"]:
        assert ask(engine, f"play {command}") == (True, "")
    # Black D9 takes white C9; white's immediate recapture at C9 repeats the position.
    assert ask(engine, "play b D9") == (True, "")
    refused = "illegal move: C9 repeats an earlier position (superko)"
    assert ask(engine, "play w C9") == (False, refused)
    assert ask(engine, "play w J1")[0] and ask(engine, "play b J2")[0]
    assert ask(engine, "play w C9") == (True, "")


def test_komi_and_final_score(engine):
    assert ask(engine, "final_score") == (True, "W+7.5")
    assert ask(engine, "komi 6") == (True, "")
    assert ask(engine, "final_score") == (True, "W+6")
    assert ask(engine, "boardsize 5") == (True, "")
    assert ask(engine, "komi 0.5") == (True, "")
    assert ask(engine, "play b C3") == (True, "")
    assert ask(engine, "final_score") == (True, "B+24.5")
    assert ask(engine, "komi 25") == (True, "")  # the position survives a komi change
    assert ask(engine, "final_score") == (True, "0")


def test_move_choice_failures_never_crash():
    def boom(game, state):
        raise RuntimeError("network\nexploded")

    engine = GtpEngine(None, boom)
    failed = "?4 move choice failed: RuntimeError: network exploded\n\n"
    assert engine.handle("4 genmove b") == failed
    assert engine.handle("name") == "= rlscale\n\n"
    occupied = GtpEngine(None, lambda game, state: 40)
    assert ask(occupied, "play b E5")[0]
    assert ask(occupied, "genmove w") == (False, "move choice was illegal: E5 is occupied")
    assert ask(occupied, "showboard")[1].count("O") == 0


def test_genmove_after_the_game_ended_passes(engine):
    assert ask(engine, "play b pass")[0] and ask(engine, "play w pass")[0]
    assert ask(engine, "genmove b") == (True, "pass")
    assert ask(engine, "play b D4") == (False, "illegal move: the game is over")


def test_run_loop_stops_at_quit(engine):
    stdin = io.StringIO("1 name\n\n# nothing\nquit\nname\n")
    stdout = io.StringIO()
    engine.run(stdin, stdout)
    assert stdout.getvalue() == "=1 rlscale\n\n=\n\n"


# --------------------------------------------------------------------------- GNU Go


class GtpProcess:
    def __init__(self, argv):
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1,
        )

    def handle(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        lines = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"GNU Go exited after {command!r}")
            if line == "\n" and lines:
                return "".join(lines) + "\n"
            lines.append(line)

    def close(self):
        try:
            self.handle("quit")
        finally:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)


def our_stones(engine, colour):
    board = engine.state.board
    return {action_to_gtp(engine.game.size, int(p)) for p in np.flatnonzero(board == colour)}


def gnugo_stones(gnugo, colour):
    ok, text = ask(gnugo, f"list_stones {colour}")
    assert ok
    return set(text.upper().split())


def play_against_gnugo(our_colour, seed, max_plies=140):
    ours = random_engine(seed=seed)
    gnugo = GtpProcess([GNUGO, "--mode", "gtp", "--level", "1", "--seed", str(seed)])
    try:
        for command in ("boardsize 9", "clear_board", "komi 7.5"):
            assert ask(ours, command)[0] and ask(gnugo, command)[0]
        passes = 0
        for ply in range(max_plies):
            colour = "bw"[ply % 2]
            mover, other = (ours, gnugo) if colour == our_colour else (gnugo, ours)
            ok, move = ask(mover, f"genmove {colour}")
            assert ok, f"genmove {colour} failed: {move}"
            if move.lower() == "resign":
                break
            ok, message = ask(other, f"play {colour} {move}")
            who = "GNU Go" if other is gnugo else "rlscale"
            assert ok, f"{who} refused {colour} {move} at ply {ply}: {message}"
            passes = passes + 1 if move.lower() == "pass" else 0
            if ply % 10 == 9 or passes == 2:
                for name, value in (("black", 1), ("white", 2)):
                    assert our_stones(ours, value) == gnugo_stones(gnugo, name), f"ply {ply}"
            if passes == 2:
                break
        assert re.fullmatch(r"[BW]\+\d+(\.5)?|0", ask(ours, "final_score")[1])
        return ours, ply + 1
    finally:
        gnugo.close()


@pytest.mark.skipif(GNUGO is None, reason="GNU Go not installed (apt-get install gnugo)")
@pytest.mark.parametrize("our_colour, seed", [("b", 1), ("w", 2)])
def test_full_games_against_gnugo(our_colour, seed):
    ours, plies = play_against_gnugo(our_colour, seed)
    assert plies > 30
    assert len(ours.moves) == plies  # every move of both sides went through our rules
    assert isinstance(ours.game, Go) and ours.game.size == 9


SHIPPED = Path(__file__).resolve().parents[2] / "src" / "rlscale" / "zero" / "models"
RLSCALE = Path(sys.executable).parent / "rlscale"


@pytest.mark.skipif(GNUGO is None, reason="GNU Go not installed (apt-get install gnugo)")
@pytest.mark.parametrize("model, size, komi", [("go7", 7, "9"), ("go9", 9, "7")])
def test_a_shipped_go_model_plays_a_full_game_against_gnugo(model, size, komi, our_colour="w"):
    """`rlscale zero gtp` with a shipped model (7x7, komi 9; 9x9, komi 7), as a controller
    starts it, plays a whole game against GNU Go (area scoring): every move it sends is legal
    to GNU Go and every GNU Go move legal to it, to two passes or a resignation. (Their
    matches, both colours: docs/go_model_card.md.)"""
    ours = GtpProcess([str(RLSCALE), "zero", "gtp", "--model", str(SHIPPED / model), "--size",
                       str(size), "--komi", komi, "--simulations", "16"])
    gnugo = GtpProcess([GNUGO, "--mode", "gtp", "--level", "1", "--chinese-rules",
                        "--capture-all-dead", "--positional-superko", "--seed", "1"])
    try:
        assert ask(ours, "name") == (True, "rlscale")
        for command in (f"boardsize {size}", "clear_board", f"komi {komi}"):
            assert ask(ours, command)[0] and ask(gnugo, command)[0]
        passes, moves = 0, []
        for ply in range(2 * size * size + 20):
            colour = "bw"[ply % 2]
            mover, other = (ours, gnugo) if colour == our_colour else (gnugo, ours)
            ok, move = ask(mover, f"genmove {colour}")
            assert ok, f"genmove {colour} failed at ply {ply}: {move}"
            moves.append(move.lower())
            if move.lower() == "resign":
                break
            ok, message = ask(other, f"play {colour} {move}")
            assert ok, f"{colour} {move} refused at ply {ply}: {message}"
            passes = passes + 1 if move.lower() == "pass" else 0
            if passes == 2:
                break
        assert passes == 2 or moves[-1] == "resign", moves
        assert sum(m not in ("pass", "resign") for m in moves) >= 10  # a game, not two passes
        assert re.fullmatch(r"[BW]\+\d+(\.5)?|0", ask(ours, "final_score")[1])
    finally:
        ours.close()
        gnugo.close()


def _save_go_model(path, play_mcts):
    """A tiny 7x7 Go network saved as training saves one: its self-play search (Gumbel, 16
    simulations) in extra.mcts and the config's play settings in extra.play_mcts."""
    import torch

    from rlscale.zero.config import MCTSConfig
    from rlscale.zero.network import PolicyValueNet, save_network

    game = Go(size=7)
    torch.manual_seed(0)
    net = PolicyValueNet(game.plane_shape, game.num_actions, blocks=1, channels=8,
                         value_hidden=8)
    selfplay = MCTSConfig(simulations=16, gumbel=True, c_puct=1.25).model_dump()
    for key in ("dirichlet_alpha", "dirichlet_fraction"):  # as the loop saves it
        selfplay.pop(key)
    save_network(net, path, "go", {"size": 7}, {"mcts": selfplay, "play_mcts": play_mcts})
    return selfplay


def test_gtp_uses_the_play_settings(tmp_path, monkeypatch):
    """The GTP engine searches with the model's saved play settings (play_mcts over its
    self-play search), not the self-play ones, for a model folder and a run directory."""
    from rlscale.cli.play import gtp_engine
    from rlscale.zero.config import MCTSConfig
    from rlscale.zero.model import Model

    play = {"gumbel": False, "c_puct": 3.0, "propagate_proofs": True}
    selfplay = _save_go_model(tmp_path / "run" / "final", play)
    expected = MCTSConfig(**{**selfplay, **play, "simulations": 6})
    for model in (tmp_path / "run" / "final", tmp_path / "run"):
        engine = gtp_engine(model, 6, 7, 5.5, seed=0)
        assert engine.choose_move.agents[7].mcts == expected

    searched = []
    original = Model.search

    def recording(self, states, simulations=None, game=None):
        searched.append((self.mcts, simulations, game.komi))
        return original(self, states, simulations, game)

    monkeypatch.setattr(Model, "search", recording)
    engine = gtp_engine(tmp_path / "run", 6, 7, 5.5, seed=0)
    assert ask(engine, "komi 6.5")[0]
    ok, text = ask(engine, "genmove b")
    assert ok and re.fullmatch(r"[A-HJ][1-7]|pass", text)
    assert searched == [(expected, 6, 6.5)]  # the play settings, under the controller's komi
    assert not searched[0][0].gumbel and searched[0][0].c_puct == 3.0


def test_arena_plays_a_go_model_on_its_own_board(tmp_path):
    """`zero arena --game go` with a 7x7 model plays 7x7 (the default board is 9x9)."""
    from typer.testing import CliRunner

    from rlscale.cli import app

    _save_go_model(tmp_path / "go7", {})
    result = CliRunner().invoke(app, ["zero", "arena", "--game", "go", "--model",
                                      str(tmp_path / "go7"), "--opponent", "random",
                                      "--games", "2", "--simulations", "4"])
    assert result.exit_code == 0, result.output
    assert "2 games" in result.output


def test_arena_writes_every_go_game_as_sgf_and_never_over_old_records(tmp_path):
    """`--sgf-dir`: one record a game, with the players by colour and the final position's
    Tromp-Taylor result; a folder that already holds records is refused before any game."""
    from typer.testing import CliRunner

    from rlscale.cli import app
    from rlscale.zero.games.go import result_string
    from rlscale.zero.sgf import from_sgf

    _save_go_model(tmp_path / "go7", {})
    args = ["zero", "arena", "--game", "go", "--model", str(tmp_path / "go7"), "--opponent",
            "random", "--games", "4", "--simulations", "4", "--sgf-dir", str(tmp_path / "sgf")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = sorted((tmp_path / "sgf").glob("game_*.sgf"))
    assert [p.name for p in records] == [f"game_000{i}.sgf" for i in range(1, 5)]
    game = Go(size=7)
    colours = set()
    for path in records:
        sgf = from_sgf(path.read_text())
        assert sgf.size == 7 and sgf.moves
        state = game.initial_state()
        for _, action in sgf.moves:
            state = game.apply(state, action)
        assert game.is_terminal(state) and sgf.result == result_string(game.score(state))
        colours.add((sgf.black, sgf.white))
    assert colours == {("net(4 sims)", "random"), ("random", "net(4 sims)")}
    first, second = (from_sgf(p.read_text()) for p in records[:2])  # one opening, colours swapped
    assert first.moves[:2] == second.moves[:2] and first.black == second.white
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "already holds game records" in again.output
    assert len(list((tmp_path / "sgf").glob("game_*.sgf"))) == 4
