import builtins

import pytest

from rlscale.zero.games import GAMES, make_game


def test_known_games():
    assert sorted(GAMES) == ["connect4", "go", "tictactoe"]
    for name in GAMES:
        assert make_game(name).name == name


def test_unknown_game_and_options():
    with pytest.raises(ValueError, match=r"unknown game 'chess' \(known: connect4, go, tictactoe"):
        make_game("chess")
    with pytest.raises(ValueError, match="game 'connect4' takes no option 'size'"):
        make_game("connect4", size=9)


def test_openspiel_missing_is_a_clear_import_error(monkeypatch):
    import sys

    real_import = builtins.__import__

    def no_pyspiel(name, *args, **kwargs):
        if name == "pyspiel":
            raise ImportError("No module named 'pyspiel'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyspiel)
    monkeypatch.delitem(sys.modules, "pyspiel", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'rlscale\[openspiel\]'"):
        make_game("openspiel:connect_four")
