"""`rlscale zero arena | compute-curve | solver-agreement | play | move | gtp | elo-curve`.

One function per command (`COMMANDS`); `register(app)` adds them to the Zero typer app. Every user error (unknown game,
missing or wrong checkpoint, malformed or illegal move) is one `error: ...` line on stderr and
exit status 2, never a traceback (RLSCALE_DEBUG=1 shows it), by the guard every rlscale
command shares (`rlscale.runtime.errors`).

Agent specs (`--opponent`, `--agent`; `rlscale.zero.arena.make_agent`): `random`, `mcts:N` (pure MCTS, N random playouts per
move), `raw` (the model's raw policy), `sims:N` (the model with N simulations), `model:PATH`
(another checkpoint, e.g. an earlier one, with `--simulations`), `solver` (Connect Four only).
A model plays with its saved play settings (`play_mcts` over its self-play search, see
`rlscale.zero.agent.play_settings`) in every command, GTP included, unless `--search` forces
PUCT or Gumbel. `--device` (default cpu; cuda, or auto) is where a model's network evaluates.

`move` contract: stdout carries the chosen move and nothing else, one line per position
(Connect Four: the column 1-7). With `--moves -` it reads one position a line from stdin
(Connect Four: the columns played, e.g. `4453`; an empty line is the empty board) and answers
each line at once, flushed, loading the model once. A malformed, illegal or finished position
gets an empty stdout line, so the Nth output line always answers the Nth input line, plus one
`error: line N: ...` line on stderr; the run goes on and exits with status 2 at the end if any
line was bad. With a single `--moves POSITION`, a bad position is an error line and status 2.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import typer

from rlscale.runtime.errors import USAGE_STATUS, guarded
from rlscale.zero.arena import check_simulations, load_model_agent, make_agent
from rlscale.zero.games.base import IllegalMove


def _short(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


_HINTS = {"connect4": "a column 1-7", "tictactoe": "a cell 1-9 or a1-c3", "go": "e.g. D4 or pass"}


def _threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def _device(name: str) -> Any:
    """The torch device `--device` names (a missing GPU is a one-line error, exit status 2)."""
    from rlscale.runtime.device import resolve_device

    return resolve_device(name)


def _model_path(model: Path | None, game: str) -> Path:
    from rlscale.zero.arena import shipped_model

    if model is not None:
        return model
    path = shipped_model(game)
    if not (path / "model.json").is_file():
        raise FileNotFoundError(f"no shipped {game} model at {path}; pass --model PATH")
    return path


def _network_agent(model: Path | None, game: str, simulations: int, search: str, seed: int,
                   name: str | None = None, device: Any = "cpu"):
    return load_model_agent(_model_path(model, game), game, simulations, search, seed,
                            name=name, device=device)


def _lazy_main(model: Path | None, game: str, simulations: int, search: str, seed: int,
               device: Any = "cpu"):
    """The --model agent, loaded on first use and then shared."""
    cache: dict[str, Any] = {}

    def get():
        if "agent" not in cache:
            cache["agent"] = _network_agent(model, game, simulations, search, seed,
                                            device=device)
        return cache["agent"]

    return get


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
        from rlscale.zero.games.connect4 import state_from_moves

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


_MODEL_OPT = typer.Option(None, "--model", help="model folder, checkpoint or run dir "
                          "(default: the shipped model of the game)")
_SEARCH_OPT = typer.Option("trained", "--search",
                           help="search settings: trained (the play settings saved with the "
                           "model), puct, gumbel")
_THREADS_OPT = typer.Option(None, "--threads", help="torch CPU threads")
# An engine answers beside other programs (a GUI, a referee, the other engine): one thread by
# default. With every core, beside other jobs on a 2-core machine, a 7x7 game against GNU Go
# took over 5 minutes instead of ~15 s (OpenMP threads spin-wait on each other).
_ENGINE_THREADS_OPT = typer.Option(
    1, "--threads", min=0, help="torch CPU threads (default 1: an engine runs beside other "
    "programs; 0: torch's default, every core)")
_OPENING_PLIES_OPT = typer.Option(2, "--opening-plies",
                                  help="random moves opening each pair of games "
                                  "(0: every game from the initial position)")
# CPU by default: a match evaluates one batch of a few positions per simulation step, where a
# GPU's per-call latency buys little for these small networks, and the CPU keeps matches
# beside a training run off its GPU and comparable with the figures measured so far.
_DEVICE_OPT = typer.Option("cpu", "--device",
                           help="where the network evaluates: cpu, cuda, or auto (a CUDA GPU "
                           "when torch sees one, else the CPU)")


@guarded
def arena(
    game: str = typer.Option("connect4", "--game"),
    model: Path | None = _MODEL_OPT,
    simulations: int = typer.Option(400, "--simulations", help="the model's budget per move"),
    opponent: str = typer.Option("mcts:1000", "--opponent",
                                 help="random | mcts:N | raw | sims:N | model:PATH | solver"),
    games: int = typer.Option(100, "--games"),
    seed: int = typer.Option(0, "--seed"),
    opening_plies: int = _OPENING_PLIES_OPT,
    search: str = _SEARCH_OPT,
    threads: int | None = _THREADS_OPT,
    device: str = _DEVICE_OPT,
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    audit: bool = typer.Option(
        False, "--audit", help="Connect Four: solve every position of every game and "
        "count each side's outcome-changing moves (slow: a position 2 plies deep takes "
        "1-5 minutes to solve)"),
) -> None:
    """Play a match of the model against an opponent; print W/D/L, score and Elo."""
    from rlscale.runtime.metrics import Heartbeat
    from rlscale.zero.arena import play_match
    from rlscale.zero.perfect_play import audit_match, audit_summary, audit_table

    if audit and game != "connect4":
        raise ValueError(f"--audit needs the Connect Four solver; the game is {game!r}")
    _threads(threads)
    dev = _device(device)
    main = _lazy_main(model, game, simulations, search, seed, dev)
    agent = main()
    g = agent.game  # the model's own board (a 7x7 Go model plays 7x7)
    rival = make_agent(opponent, game, main, simulations, search, seed + 1, dev)
    beat = Heartbeat(f"{agent.name} vs {rival.name}").beat
    result = play_match(g, agent, rival, games, seed=seed, opening_plies=opening_plies,
                        progress=lambda done, total, moves: beat(
                            f"{done}/{total} games finished, {moves} moves played"))
    audits = None
    if audit:
        audit_beat = Heartbeat("audit").beat

        def audited(done: int, total: int) -> None:
            audit_beat(f"{done}/{total} games audited")

        audits = audit_match(result, progress=audited)
    if as_json:
        extra = {}
        if audits is not None:
            extra = {"audit": audit_summary(audits),
                     "audit_games": [a.as_dict() for a in audits]}
        typer.echo(json.dumps({"game": game, "simulations": simulations,
                               "opponent": opponent, **result.summary(), **extra}, indent=2))
        return
    elo = result.elo()
    typer.echo(f"{result.agent_a} vs {result.agent_b}: {result.games} games "
               f"({result.distinct_games} distinct), {result.seconds:.0f} s")
    typer.echo(f"W/D/L {result.wins}/{result.draws}/{result.losses}  "
               f"(moving first {'/'.join(map(str, result.as_first))}, "
               f"second {'/'.join(map(str, result.as_second))})")
    interval = "" if "bound" in str(elo) else " (95% CI)"  # an infinite estimate names its bound
    typer.echo(f"score {100 * result.score:.1f}%  Elo {elo}{interval}")
    if audits is not None:
        typer.echo(audit_table(audits, result.agent_a, result.agent_b))


@guarded
def compute_curve(
    game: str = typer.Option("connect4", "--game"),
    model: Path | None = _MODEL_OPT,
    games: int = typer.Option(100, "--games", help="games per point"),
    max_simulations: int = typer.Option(800, "--max-simulations"),
    simulations: str | None = typer.Option(
        None, "--simulations", help="comma-separated budgets (default 0,1,2,4,...,max)"),
    out: Path = typer.Option(Path("runs/zero/compute_curve"), "--out"),
    seed: int = typer.Option(0, "--seed"),
    opening_plies: int = _OPENING_PLIES_OPT,
    search: str = _SEARCH_OPT,
    threads: int | None = _THREADS_OPT,
    device: str = _DEVICE_OPT,
) -> None:
    """The model with 0, 1, 2, 4, ... simulations against its raw policy: table + PNG."""
    from rlscale.zero import arena as arena_lib

    _threads(threads)
    if simulations:
        try:
            budgets = [int(s) for s in simulations.split(",") if s.strip()]
        except ValueError:
            raise ValueError(
                f"bad --simulations {simulations!r}: integers, comma-separated"
            ) from None
    else:
        budgets = arena_lib.curve_simulations(max_simulations)
    agent = _network_agent(model, game, 0, search, seed, device=_device(device))
    g = agent.game  # the model's own board (a 7x7 Go model plays 7x7)
    typer.echo(arena_lib.curve_table([]))

    def show(point):
        typer.echo(arena_lib.curve_table([point]).splitlines()[-1])

    points = arena_lib.compute_curve(g, agent, budgets, games, seed, opening_plies,
                                     on_point=show)
    png = arena_lib.write_compute_curve(points, out, title=f"{game}: search vs raw policy")
    typer.echo(f"wrote {out / 'curve.md'}, {out / 'curve.json'} and {png}")


@guarded
def solver_agreement(
    model: Path | None = _MODEL_OPT,
    simulations: int = typer.Option(400, "--simulations"),
    files: str = typer.Option("Test_L3_R1,Test_L2_R1,Test_L2_R2", "--files"),
    limit: int | None = typer.Option(None, "--limit", help="first N positions per file"),
    agent_spec: str = typer.Option("model", "--agent",
                                   help="model | raw | sims:N | random | mcts:N | solver"),
    data_dir: Path | None = typer.Option(None, "--data-dir",
                                         help="default <repo>/../shared/data/connect4"),
    seed: int = typer.Option(0, "--seed"),
    search: str = _SEARCH_OPT,
    threads: int | None = _THREADS_OPT,
    device: str = _DEVICE_OPT,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Share of Connect Four benchmark positions where the move keeps the solver's value."""
    from rlscale.zero.perfect_play import agreement_table
    from rlscale.zero.perfect_play import solver_agreement as agreement

    _threads(threads)
    dev = _device(device)
    main = _lazy_main(model, "connect4", simulations, search, seed, dev)
    agent = make_agent(agent_spec, "connect4", main, simulations, search, seed, dev)
    names = [f.strip() for f in files.split(",") if f.strip()]
    results = agreement(agent, names, limit=limit, data_dir=data_dir)
    if as_json:
        rows = [{"file": r.file, "positions": r.positions, "agreed": r.agreed,
                 "share": r.share} for r in results]
        typer.echo(json.dumps({"agent": agent.name, "files": rows}, indent=2))
        return
    typer.echo(agreement_table(results, agent.name))


@guarded
def play(
    game: str = typer.Option("connect4", "--game"),
    model: Path | None = _MODEL_OPT,
    simulations: int = typer.Option(400, "--simulations"),
    first: str = typer.Option("human", "--first", help="who moves first: human or model"),
    search: str = _SEARCH_OPT,
    seed: int = typer.Option(0, "--seed"),
    device: str = _DEVICE_OPT,
) -> None:
    """Play the model in the terminal: type a move, or `quit`."""
    if first not in ("human", "model"):
        raise ValueError(f"--first must be human or model, not {first!r}")
    agent = _network_agent(model, game, simulations, search, seed, device=_device(device))
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
    moves: str = typer.Option(..., "--moves",
                              help="the moves played so far (connect4: 4453), or - for stdin"),
    game: str = typer.Option("connect4", "--game"),
    model: Path | None = _MODEL_OPT,
    simulations: int = typer.Option(400, "--simulations"),
    search: str = _SEARCH_OPT,
    seed: int = typer.Option(0, "--seed"),
    threads: int = _ENGINE_THREADS_OPT,
    device: str = _DEVICE_OPT,
) -> None:
    """Print the model's move for a position (one line, nothing else on stdout)."""
    _threads(threads)
    agent = _network_agent(model, game, simulations, search, seed, device=_device(device))
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
    game: str = typer.Option("go", "--game"),
    model: Path | None = typer.Option(None, "--model", help="a Go model (default: a fresh "
                                      "tiny network, for testing controllers)"),
    simulations: int = typer.Option(200, "--simulations"),
    size: int | None = typer.Option(
        None, "--size", help="board size (default: the model's; 9 without a model)"),
    komi: float | None = typer.Option(
        None, "--komi", help="komi (default: the model's; 7.5 without a model); the "
        "controller's komi command changes it"),
    seed: int = typer.Option(0, "--seed"),
    threads: int = _ENGINE_THREADS_OPT,
    device: str = _DEVICE_OPT,
) -> None:
    """Go Text Protocol on stdin/stdout, moves chosen by the network's search."""
    if game != "go":
        raise ValueError(f"gtp plays go, not {game!r}")
    _threads(threads)
    engine = gtp_engine(model, simulations, size, komi, seed, _device(device))
    engine.run(sys.stdin, sys.stdout)


@guarded
def elo_curve(
    run_dir: Path = typer.Argument(..., help="a `rlscale zero train` run directory"),
    games: int = typer.Option(20, "--games", help="games per pairing"),
    simulations: int = typer.Option(64, "--simulations",
                                    help="each checkpoint's search budget per move (0: raw)"),
    anchors: str = typer.Option("random,mcts:200", "--anchors",
                                help="fixed opponents, comma-separated (random, mcts:N, solver, "
                                "model:PATH); the first is rated 0"),
    neighbours: int = typer.Option(2, "--neighbours",
                                   help="later checkpoints each checkpoint plays"),
    out: Path | None = typer.Option(None, "--out", help="default RUN_DIR/elo_curve"),
    seed: int = typer.Option(0, "--seed"),
    opening_plies: int = _OPENING_PLIES_OPT,
    search: str = _SEARCH_OPT,
    threads: int | None = _THREADS_OPT,
    device: str = _DEVICE_OPT,
) -> None:
    """Elo of a run's checkpoints against each other and fixed anchors: table, JSON, CSV and
    a plot against iteration and self-play games."""
    from rlscale.zero import elo_curve as curves
    from rlscale.zero.network import read_meta

    _threads(threads)
    dev = _device(device)
    check_simulations(simulations)
    checkpoints = curves.find_checkpoints(run_dir)
    game = read_meta(checkpoints[0].path).game
    specs = [a.strip() for a in anchors.split(",") if a.strip()]
    if len(set(specs)) != len(specs):
        raise ValueError(f"--anchors names a player twice: {anchors!r}")

    def no_model():
        raise ValueError("an anchor cannot be the run's own model: use model:PATH")

    rivals = {spec: make_agent(spec, game, no_model, simulations, search, seed + 1000 + i, dev)
              for i, spec in enumerate(specs)}

    def load(c):
        return _network_agent(c.path, game, simulations, search, seed, name=c.name, device=dev)

    def show(result):
        typer.echo(f"{result.agent_a} vs {result.agent_b}: W/D/L {result.wins}/{result.draws}/"
                   f"{result.losses} ({result.seconds:.0f} s)", err=True)

    curve = curves.elo_curve(checkpoints, load, rivals, games, seed, neighbours, opening_plies,
                             run_dir=run_dir, on_match=show)
    curve.settings.update(simulations=simulations, search=search, anchors=specs)
    paths = curves.write_elo_curve(curve, out or run_dir / "elo_curve")
    typer.echo(curves.elo_table(curve))
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


# The subcommands, by name; `register` adds them to the Zero typer app.
COMMANDS = {
    "arena": arena, "compute-curve": compute_curve, "solver-agreement": solver_agreement,
    "play": play, "move": move, "gtp": gtp, "elo-curve": elo_curve,
}


def register(app: typer.Typer) -> None:
    """Add the arena commands to the Zero typer app."""
    for name, command in COMMANDS.items():
        app.command(name)(command)


@dataclass
class GtpPlayer:
    """The GTP engine's move choice: per board size an Agent (the model's network, or a fresh
    tiny one for testing controllers) with its play settings, `simulations` of search (0:
    its raw policy) under the engine's current rules (the controller sets the komi)."""

    agents: dict[int, Any]  # board size -> rlscale.zero.agent.Agent
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

    from rlscale.zero.agent import Agent, model_folder, play_settings
    from rlscale.zero.config import MCTSConfig, NetworkConfig
    from rlscale.zero.games.go import Go
    from rlscale.zero.gtp import GtpEngine
    from rlscale.zero.network import load_network, network_for, read_meta

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
        player.agents[size] = Agent(game, net, play_settings(meta.extra, simulations=budget),
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
            player.agents[size] = Agent(game, net, MCTSConfig(simulations=budget), seed=seed)
        return game

    return GtpEngine(factory, player, size=size, komi=komi)
