import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rlscale.zero.agents import _OneByOne, make_agent
from rlscale.zero.games.go import Go, random_move, result_string
from rlscale.zero.gtp_client import GtpAgent, GtpEngineError, GtpProcess, opening_moves
from rlscale.zero.matches import play_match
from rlscale.zero.sgf import from_sgf, replay

GNUGO = shutil.which("gnugo") or ("/usr/games/gnugo" if Path("/usr/games/gnugo").exists() else None)
GNUGO_FLAGS = "--mode gtp --level 1 --chinese-rules --capture-all-dead --positional-superko"


def fake_engine(tmp_path, genmove_answers):
    """argv of a tiny GTP engine: `=` to everything, genmove answered from the list in turn."""
    script = tmp_path / "engine.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        answers = iter({genmove_answers!r})
        for line in sys.stdin:
            word = line.split()[0] if line.split() else ""
            reply = {{"name": "fake", "version": "1"}}.get(word, "")
            if word == "genmove":
                reply = next(answers)
            sys.stdout.write(("= " + reply).rstrip() + "\\n\\n")
            sys.stdout.flush()
            if word == "quit":
                break
    """))
    return [sys.executable, str(script)]


class TidyRandom(_OneByOne):
    """Random stones that never fill its own eyes; passes after the opponent's pass."""

    name = "tidy-random"

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def act(self, game, state):
        return game.pass_action if state.passes else random_move(game, state, self.rng)


def check_records(game, result, sgf_dir, engine_name):
    """Every game of the match has an SGF with all its moves (the opponent's last one too:
    the arena tells the agent each game is over), its result and the engine's name."""
    records = [from_sgf(path.read_text()) for path in sorted(sgf_dir.glob("game_*.sgf"))]
    assert len(records) == result.games
    by_moves = {tuple(a for _, a in r.moves): r for r in records}
    for played in result.records:
        record = by_moves[tuple(played.moves)]
        assert (record.size, record.komi) == (game.size, game.komi)
        assert [p for p, _ in record.moves] == [i % 2 for i in range(len(played.moves))]
        final = replay(game, record.moves)[-1]
        engine_colour = 1 if played.a_first else 0  # the GTP agent is agent B
        assert (record.black, record.white)[engine_colour] == engine_name
        assert game.is_terminal(final)
        assert record.result == result_string(game.score(final))
        assert game.outcome(final) == played.outcome
        assert "inferred at close" not in record.properties.get("C", "")
    return records


@pytest.mark.skipif(GNUGO is None, reason="GNU Go not installed (apt-get install -y gnugo)")
def test_full_games_against_gnugo_write_valid_sgf(tmp_path):
    game = Go(7, komi=9)
    with GtpAgent(f"{GNUGO} {GNUGO_FLAGS}", sgf_dir=tmp_path / "sgf") as gnugo:
        process = gnugo.engine.proc
        assert gnugo.player_name.startswith("GNU Go")
        # Two random plies open each pair of games: the agent rebuilds them from the stones.
        result = play_match(game, TidyRandom(3), gnugo, 4, seed=1, opening_plies=2)
    assert process.poll() is not None  # the engine is gone
    assert result.games == 4 and result.losses == 4  # GNU Go beats random play on 7x7
    records = check_records(game, result, tmp_path / "sgf", gnugo.player_name)
    assert all(len(r.moves) > 20 for r in records)
    assert (gnugo.resignations, gnugo.refused) == (0, 0)


def test_our_gtp_engine_as_the_opponent_one_game_at_a_time(tmp_path):
    game = Go(5, komi=0.5)
    with GtpAgent([sys.executable, "-m", "rlscale.zero.gtp"], sgf_dir=tmp_path) as engine:
        assert engine.player_name.startswith("rlscale")
        result = play_match(game, TidyRandom(0), engine, 4, seed=0, opening_plies=0,
                            concurrency=1)
        # One game at a time: the engine's board follows the game, no replay from scratch.
        assert engine._board is None or len(engine._board[2]) > 0
    check_records(game, result, tmp_path, engine.player_name)


def test_resign_and_refused_moves_are_passes(tmp_path):
    game = Go(5, komi=0.5)
    state = game.initial_state()
    with GtpAgent(fake_engine(tmp_path, ["C3", "C3", "resign"]), sgf_dir=tmp_path) as agent:
        assert agent.act(game, state) == 12  # C3
        state = game.apply(game.apply(state, 12), 0)  # ... and the opponent's A5
        assert agent.act(game, state) == game.pass_action  # C3 is occupied
        state = game.apply(game.apply(state, game.pass_action), 1)
        assert agent.act(game, state) == game.pass_action  # resign
        assert (agent.refused, agent.resignations) == (1, 1)
        record = from_sgf((tmp_path / "game_0001.sgf").read_text())  # written at every move
        assert record.moves == [(0, 12), (1, 0), (0, 25), (1, 1), (0, 25)]
        assert "C3, illegal here (C3 is occupied)" in record.properties["C"]
        assert "resigned (played as a pass)" in record.properties["C"]
        assert record.result is None  # the game goes on


def test_a_game_the_opponent_ends_is_completed_at_close(tmp_path):
    game = Go(5, komi=0.5)
    with GtpAgent(fake_engine(tmp_path, ["pass"]), sgf_dir=tmp_path) as agent:
        state = game.apply(game.initial_state(), 12)
        assert agent.act(game, state) == game.pass_action
    record = from_sgf((tmp_path / "game_0001.sgf").read_text())
    assert record.moves == [(0, 12), (1, 25), (0, 25)]  # the opponent's closing pass
    assert record.result == "B+24.5" and "inferred at close" in record.properties["C"]
    # At the move cap any move ends the game: the last one is unknown and there is no result.
    capped = Go(5, komi=0.5, max_moves=3)
    with GtpAgent(fake_engine(tmp_path, ["pass"]), sgf_dir=tmp_path / "capped") as agent:
        agent.act(capped, capped.apply(capped.initial_state(), 12))
    record = from_sgf((tmp_path / "capped" / "game_0001.sgf").read_text())
    assert record.moves == [(0, 12), (1, 25)] and record.result is None
    assert "ended on the opponent's next move, not seen" in record.properties["C"]


def test_the_arena_completes_the_record_of_a_game_the_opponent_ends(tmp_path):
    """At the move cap any move ends the game: told the final position (`game_over`), the
    agent records the opponent's last move and the result, with nothing inferred."""
    capped = Go(5, komi=0.5, max_moves=3)
    with GtpAgent(fake_engine(tmp_path, ["pass"]), sgf_dir=tmp_path / "capped") as agent:
        state = capped.apply(capped.initial_state(), 12)
        after = capped.apply(state, agent.act(capped, state))
        final = capped.apply(after, 7)
        assert capped.is_terminal(final)
        agent.game_over(capped, final)
        agent.game_over(capped, final)  # told twice (it played both sides): no change
    record = from_sgf((tmp_path / "capped" / "game_0001.sgf").read_text())
    assert record.moves == [(0, 12), (1, 25), (0, 7)]
    assert record.result == result_string(capped.score(final))
    assert "C" not in record.properties or "not seen" not in record.properties["C"]


def test_dead_hung_and_missing_engines_are_one_line_errors(tmp_path):
    dies = [sys.executable, "-c", "import sys; sys.stdin.readline(); "
            "sys.stderr.write('boom\\n'); sys.exit(3)"]
    with pytest.raises(GtpEngineError, match=r"exited with status 3 \(at 'name'\); its stderr "
                       "ends: boom") as err:
        GtpAgent(dies)
    assert "\n" not in str(err.value)
    hangs = GtpProcess([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    with pytest.raises(GtpEngineError, match="did not answer 'name' within 0.5 s"):
        hangs.send("name")
    assert hangs.proc.poll() is not None  # killed at once
    with pytest.raises(GtpEngineError, match="was stopped"):
        hangs.send("name")
    with pytest.raises(GtpEngineError, match="cannot start GTP engine '/no/such/engine'"):
        GtpAgent("/no/such/engine --mode gtp")


def test_opening_moves_rebuild_short_openings():
    game = Go(5)
    rng = np.random.default_rng(0)
    for _ in range(20):
        state, moves = game.initial_state(), []
        for _ in range(int(rng.integers(0, 5))):
            action = random_move(game, state, rng) if rng.random() < 0.8 else game.pass_action
            if game.is_terminal(game.apply(state, action)):
                break
            moves.append(action)
            state = game.apply(state, action)
        rebuilt = replay(game, opening_moves(game, state))[-1]
        assert np.array_equal(rebuilt.board, state.board)
        assert (rebuilt.to_play, rebuilt.passes) == (state.to_play, state.passes)
    # After a capture the moves are not the stones, but another sequence reaches the board.
    captured = replay(game, [(0, 1), (1, 0), (0, 5)])[-1]  # black takes the corner stone
    assert opening_moves(game, captured) == [(0, 1), (1, 25), (0, 5)]
    setup = game.from_diagram(". X . . .\n" + ". . . . .\n" * 4)  # a stone and no moves
    with pytest.raises(ValueError, match="cannot rebuild the moves of a game first seen at"):
        opening_moves(game, setup)


def test_make_agent_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    agent = make_agent(f"gtp:{sys.executable} -m rlscale.zero.gtp", "go", None, 0, "trained", 0)
    try:
        assert agent.name.startswith("gtp:python") and agent.sgf_dir.is_dir()
        assert agent.sgf_dir.parent == Path("runs/zero/gtp")
    finally:
        agent.close()
    with pytest.raises(ValueError, match="plays go, not 'connect4'"):
        make_agent("gtp:gnugo", "connect4", None, 0, "trained", 0)
    with pytest.raises(ValueError, match="give the engine's command line"):
        make_agent("gtp: ", "go", None, 0, "trained", 0)
