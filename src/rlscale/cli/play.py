"""`rlscale zero play | move | gtp`: the model plays one game, against a person in the
terminal, a position at a time, or a Go program over the Go Text Protocol. Their options and
model loading are the arena's (arena.py).

`move` contract: stdout carries the chosen move and nothing else, one line per position
(Connect Four: the column 1-7). With `--moves -` it reads one position a line from stdin
(Connect Four: the columns played, e.g. `4453`; an empty line is the empty board) and answers
each line at once, flushed, loading the model once. A malformed, illegal or finished position
gets an empty stdout line, so the Nth output line always answers the Nth input line, plus one
`error: line N: ...` line on stderr; the run goes on and exits with status 2 at the end if any
line was bad. With a single `--moves POSITION`, a bad position is an error line and status 2.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from ..runtime.errors import USAGE_STATUS, guarded
from ..zero.agents import check_simulations
from ..zero.games.base import IllegalMove
from .arena import (
    DeviceOption,
    GameOption,
    ModelOption,
    SearchOption,
    SeedOption,
    network_agent,
    set_threads,
    torch_device,
)

# An engine answers beside other programs (a GUI, a referee, the other engine): one thread by
# default. With every core, beside other jobs on a 2-core machine, a 7x7 game against GNU Go
# took over 5 minutes instead of ~15 s (OpenMP threads spin-wait on each other).
EngineThreadsOption = Annotated[int, typer.Option(
    "--threads", min=0, help="torch CPU threads (default 1: an engine runs beside other "
    "programs; 0: torch's default, every core)")]


def _short(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


_HINTS = {"connect4": "a column 1-7", "tictactoe": "a cell 1-9 or a1-c3", "go": "e.g. D4 or pass"}


def parse_position(game: Any, text: str) -> Any:
    """The state after the moves in `text`: Connect Four columns (`4453`), tic-tac-toe cells
    (`159`), Go GTP moves separated by spaces (`D4 E5 pass`). Raises IllegalMove."""
    text = text.strip()
    try:
        return _parse_position(game, text)
    except IllegalMove as err:  # never echo a huge input back whole
        raise IllegalMove(str(err).replace(repr(text), _short(text))) from None


def _parse_position(game: Any, text: str) -> Any:
    if game.name == "connect4":
        from ..zero.games.connect4 import state_from_moves

        state = state_from_moves(game, text)
    else:
        tokens = text.split() if (game.name == "go" or " " in text) else list(text)
        state = game.initial_state()
        for i, token in enumerate(tokens):
            try:
                state = game.apply(state, game.parse_move(state, token))
            except IllegalMove as err:
                raise IllegalMove(f"move {i + 1} of {text!r}: {err}") from None
    if game.is_terminal(state):
        raise IllegalMove(f"position {text!r} is already over")
    return state


@guarded
def play(
    game: GameOption = "connect4",
    model: ModelOption = None,
    simulations: Annotated[int, typer.Option("--simulations")] = 400,
    first: Annotated[str, typer.Option(
        "--first", help="who moves first: human or model")] = "human",
    search: SearchOption = "trained",
    seed: SeedOption = 0,
    device: DeviceOption = "cpu",
) -> None:
    """Play the model in the terminal: type a move, or `quit`."""
    if first not in ("human", "model"):
        raise ValueError(f"--first must be human or model, not {first!r}")
    agent = network_agent(model, game, simulations, search, seed, device=torch_device(device))
    g = agent.game
    human = 0 if first == "human" else 1
    hint = _HINTS.get(game, "a move")
    out = sys.stdout
    out.write(f"you play {'first' if human == 0 else 'second'}"
              f"{' (X)' if human == 0 else ' (O)'} against {agent.name}; "
              f"type {hint}, or quit\n")
    state = g.initial_state()
    out.write(g.render(state) + "\n")
    while not g.is_terminal(state):
        if g.to_play(state) == human:
            out.write(f"your move ({hint}, quit): ")
            out.flush()
            line = sys.stdin.readline()
            if not line or line.strip().lower() in ("quit", "q", "exit", "resign"):
                out.write("\nbye\n" if not line else "bye\n")
                return
            try:
                action = g.parse_move(state, line.strip())
            except IllegalMove as err:
                out.write(f"illegal move: {err}; try again\n")
                continue
        else:
            action = agent.act(g, state)
            out.write(f"model plays {g.format_move(state, action)}\n")
        state = g.apply(state, action)
        out.write(g.render(state) + "\n")
    z = g.outcome(state)
    z = z if human == 0 else -z
    out.write("you win\n" if z > 0 else "the model wins\n" if z < 0 else "draw\n")


@guarded
def move(
    moves: Annotated[str, typer.Option(
        "--moves", help="the moves played so far (connect4: 4453), or - for stdin")],
    game: GameOption = "connect4",
    model: ModelOption = None,
    simulations: Annotated[int, typer.Option("--simulations")] = 400,
    search: SearchOption = "trained",
    seed: SeedOption = 0,
    threads: EngineThreadsOption = 1,
    device: DeviceOption = "cpu",
) -> None:
    """Print the model's move for a position (one line, nothing else on stdout)."""
    set_threads(threads)
    agent = network_agent(model, game, simulations, search, seed, device=torch_device(device))
    g = agent.game
    out = sys.stdout
    if moves != "-":
        state = parse_position(g, moves)
        out.write(g.format_move(state, agent.act(g, state)) + "\n")
        return
    bad = 0
    for number, line in enumerate(iter(sys.stdin.readline, ""), start=1):
        try:
            state = parse_position(g, line)
            answer = g.format_move(state, agent.act(g, state))
        except IllegalMove as err:
            bad += 1
            answer = ""
            sys.stderr.write(f"error: line {number}: {err}\n")
            sys.stderr.flush()
        out.write(answer + "\n")
        out.flush()
    if bad:
        raise typer.Exit(USAGE_STATUS)


@guarded
def gtp(
    game: GameOption = "go",
    model: Annotated[Path | None, typer.Option(
        "--model", help="a Go model (default: a fresh tiny network, for testing controllers)")
    ] = None,
    simulations: Annotated[int, typer.Option("--simulations")] = 200,
    size: Annotated[int | None, typer.Option(
        "--size", help="board size (default: the model's; 9 without a model)")] = None,
    komi: Annotated[float | None, typer.Option(
        "--komi", help="komi (default: the model's; 7.5 without a model); the controller's "
        "komi command changes it")] = None,
    seed: SeedOption = 0,
    threads: EngineThreadsOption = 1,
    device: DeviceOption = "cpu",
) -> None:
    """Go Text Protocol on stdin/stdout, moves chosen by the network's search."""
    if game != "go":
        raise ValueError(f"gtp plays go, not {game!r}")
    set_threads(threads)
    engine = gtp_engine(model, simulations, size, komi, seed, torch_device(device))
    engine.run(sys.stdin, sys.stdout)


@dataclass
class GtpPlayer:
    """The GTP engine's move choice: per board size a Model (the model's network, or a fresh
    tiny one for testing controllers) with its play settings, `simulations` of search (0:
    its raw policy) under the engine's current rules (the controller sets the komi)."""

    agents: dict[int, Any]  # board size -> rlscale.zero.model.Model
    simulations: int

    def __call__(self, game: Any, state: Any) -> int:
        return self.agents[game.size].choose_move(game, state, self.simulations)


DEFAULT_GO_SIZE, DEFAULT_GO_KOMI = 9, 7.5  # `zero gtp` without a model: a fresh network


def gtp_engine(model: Path | None, simulations: int, size: int | None, komi: float | None,
               seed: int, device: Any = "cpu"):
    """A GtpEngine whose move is `simulations` of the model's search with its saved play
    settings (`play_mcts`); without a model, a fresh tiny network per board size. `size` and
    `komi` None: the model's board and komi (9x9 and 7.5 without a model)."""
    import torch

    from ..zero.config import MCTSConfig, NetworkConfig
    from ..zero.games.go import Go
    from ..zero.gtp import GtpEngine
    from ..zero.model import Model, model_folder, play_settings
    from ..zero.network import load_network, network_for, read_meta

    check_simulations(simulations)
    if komi is not None and (not np.isfinite(komi) or abs(komi) > 1000):
        raise ValueError(f"--komi must be a finite number of points, got {komi}")
    budget = max(simulations, 1)
    player = GtpPlayer({}, simulations)
    game_kwargs: dict[str, Any] = {}
    if model is None:
        size = DEFAULT_GO_SIZE if size is None else size
        komi = DEFAULT_GO_KOMI if komi is None else komi
    else:
        # The network loader's own game check compares every game keyword (komi included),
        # but a GTP controller sets komi itself: compare the game and the board size here.
        # A network plays the board it was trained on; komi is a rule of the game played, so
        # another one is allowed (the model's is only the default).
        folder = model_folder(model)
        meta = read_meta(folder)
        if meta.game != "go":
            raise ValueError(f"checkpoint {model} is for {meta.describe_game()}, not for go")
        model_size = int(meta.game_kwargs.get("size", DEFAULT_GO_SIZE))
        size = model_size if size is None else size
        komi = float(meta.game_kwargs.get("komi", DEFAULT_GO_KOMI)) if komi is None else komi
        if model_size != size:
            raise ValueError(f"checkpoint {model} is for a {model_size}x{model_size} go board, "
                             f"not {size}x{size} (leave out --size to play its board)")
        net, _ = load_network(folder, device=device)
        game_kwargs = {k: v for k, v in meta.game_kwargs.items() if k not in ("size", "komi")}
        game = Go(size=size, komi=komi, **game_kwargs)
        player.agents[size] = Model(game, net, play_settings(meta.extra, simulations=budget),
                                    seed=seed)
    Go(size=size, komi=komi, **game_kwargs)  # an unknown size fails here, as one line

    def factory(size: int, komi: float) -> Go:
        if model is not None and size not in player.agents:
            only = next(iter(player.agents))
            raise ValueError(f"the model plays {only}x{only} only")
        game = Go(size=size, komi=komi, **game_kwargs)
        if size not in player.agents:
            torch.manual_seed(seed)
            net = network_for(game, NetworkConfig()).to(device).eval()
            player.agents[size] = Model(game, net, MCTSConfig(simulations=budget), seed=seed)
        return game

    return GtpEngine(factory, player, size=size, komi=komi)
