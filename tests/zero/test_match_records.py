"""The Go model card's strength can be checked from the repository: every match committed
under docs/go/ (the SGFs and `match.txt`) replays under rlscale's rules (Tromp-Taylor area
scoring, positional superko) to each record's stated result, and the folder's games add up
to the W/D/L its `match.txt` reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlscale.zero.games.go import Go, result_string
from rlscale.zero.sgf import SgfGame, from_sgf

RECORDS = Path(__file__).resolve().parents[2] / "docs" / "go"
FOLDERS = sorted(p for p in RECORDS.iterdir() if any(p.glob("game_*.sgf")))


def final_result(record: SgfGame) -> str:
    """The result of the record's final position, replayed move by move (a colour that
    moves twice in a row, as a GTP engine may after a pass, is set to move)."""
    game = Go(size=record.size, komi=record.komi)
    state = game.initial_state()
    for player, action in record.moves:
        assert not game.is_terminal(state), "a move after the game ended"
        if game.to_play(state) != player:
            state = game.set_to_play(state, player)
        state = game.apply(state, action)  # an illegal move raises
    assert game.is_terminal(state), "the record stops before the game ends"
    return result_string(game.score(state))


def model_plays_black(record: SgfGame) -> bool:
    """rlscale's network is `net(...)` (arena --sgf-dir) or unnamed (the GTP opponent's own
    records name only the engine)."""
    return record.black == "" or record.black.startswith("net(")


def test_there_are_records_to_check():
    assert len(FOLDERS) >= 5


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_each_committed_match_replays_to_its_reported_score(folder):
    reported = re.search(r"W/D/L (\d+)/(\d+)/(\d+)", (folder / "match.txt").read_text())
    assert reported, f"{folder}/match.txt reports no W/D/L"
    wins = draws = losses = 0
    for path in sorted(folder.glob("game_*.sgf")):
        record = from_sgf(path.read_text())
        assert record.result == final_result(record), path.name
        if record.result == "0":
            draws += 1
        elif record.result.startswith("B") == model_plays_black(record):
            wins += 1
        else:
            losses += 1
    assert (wins, draws, losses) == tuple(map(int, reported.groups()))
