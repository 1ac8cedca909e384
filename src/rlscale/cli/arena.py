"""`rlscale zero arena | compute-curve | solver-agreement | elo-curve`, and the options and
model loading they share with `play | move | gtp` (play.py); rlscale.cli.zero adds all seven to
the Zero typer app. Every user error (unknown game, missing or wrong checkpoint, malformed or
illegal move) is one `error: ...` line on stderr and exit status 2, never a traceback
(RLSCALE_DEBUG=1 shows it), by the guard every rlscale command shares
(`rlscale.runtime.errors`).

Agent specs (`--opponent`, `--agent`; `rlscale.zero.agents.make_agent`): `random`, `mcts:N`
(pure MCTS, N random playouts per move), `raw` (the model's raw policy), `sims:N` (the model
with N simulations), `model:PATH` (another checkpoint, e.g. an earlier one, with
`--simulations`), `solver` (Connect Four only). A model plays with its saved play settings
(`play_mcts` over its self-play search, see `rlscale.zero.model.play_settings`) in every
command, GTP included, unless `--search` forces PUCT or Gumbel. `--device` (default cpu; cuda,
or auto) is where a model's network evaluates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ..runtime.errors import guarded
from ..zero.agents import check_simulations, load_model_agent, make_agent


def set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def torch_device(name: str) -> Any:
    """The torch device `--device` names (a missing GPU is a one-line error, exit status 2)."""
    from ..runtime.device import resolve_device

    return resolve_device(name)


def _model_path(model: Path | None, game: str) -> Path:
    from ..zero.model import shipped_model

    if model is not None:
        return model
    path = shipped_model(game)
    if not (path / "model.json").is_file():
        raise FileNotFoundError(f"no shipped {game} model at {path}; pass --model PATH")
    return path


def network_agent(model: Path | None, game: str, simulations: int, search: str, seed: int,
                  name: str | None = None, device: Any = "cpu"):
    """The --model agent (the game's shipped model without one)."""
    return load_model_agent(_model_path(model, game), game, simulations, search, seed,
                            name=name, device=device)


def lazy_model_agent(model: Path | None, game: str, simulations: int, search: str, seed: int,
                     device: Any = "cpu"):
    """The --model agent, loaded on first use and then shared."""
    cache: dict[str, Any] = {}

    def get():
        if "agent" not in cache:
            cache["agent"] = network_agent(model, game, simulations, search, seed,
                                           device=device)
        return cache["agent"]

    return get


# The options several commands share (each command gives the default).
ModelOption = Annotated[Path | None, typer.Option(
    "--model", help="model folder, checkpoint or run dir (default: the shipped model of the game)")]
SearchOption = Annotated[str, typer.Option(
    "--search", help="search settings: trained (the play settings saved with the model), puct, "
    "gumbel")]
ThreadsOption = Annotated[int | None, typer.Option("--threads", help="torch CPU threads")]
OpeningPliesOption = Annotated[int, typer.Option(
    "--opening-plies", help="random moves opening each pair of games (0: every game from the "
    "initial position)")]
# CPU by default: a match evaluates one batch of a few positions per simulation step, where a
# GPU's per-call latency buys little for these small networks, and the CPU keeps matches
# beside a training run off its GPU and comparable with the figures measured so far.
DeviceOption = Annotated[str, typer.Option(
    "--device", help="where the network evaluates: cpu, cuda, or auto (a CUDA GPU when torch "
    "sees one, else the CPU)")]
GameOption = Annotated[str, typer.Option("--game")]
SeedOption = Annotated[int, typer.Option("--seed")]


@guarded
def arena(
    game: GameOption = "connect4",
    model: ModelOption = None,
    simulations: Annotated[int, typer.Option(
        "--simulations", help="the model's budget per move")] = 400,
    opponent: Annotated[str, typer.Option(
        "--opponent", help="random | mcts:N | raw | sims:N | model:PATH | solver")] = "mcts:1000",
    games: Annotated[int, typer.Option("--games")] = 100,
    seed: SeedOption = 0,
    opening_plies: OpeningPliesOption = 2,
    search: SearchOption = "trained",
    threads: ThreadsOption = None,
    device: DeviceOption = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    audit: Annotated[bool, typer.Option(
        "--audit", help="Connect Four: solve every position of every game and count each "
        "side's outcome-changing moves (slow: a position 2 plies deep takes 1-5 minutes to "
        "solve)")] = False,
    sgf_dir: Annotated[Path | None, typer.Option(
        "--sgf-dir", help="Go: write every game as SGF there (game_0001.sgf on; a folder "
        "that already holds game records is refused)")] = None,
) -> None:
    """Play a match of the model against an opponent; print W/D/L, score and Elo."""
    from ..runtime.metrics import Heartbeat
    from ..zero.matches import check_new_sgf_dir, play_match, write_match_sgfs
    from ..zero.perfect_play import audit_match, audit_summary, audit_table

    if audit and game != "connect4":
        raise ValueError(f"--audit needs the Connect Four solver; the game is {game!r}")
    if sgf_dir is not None:
        if game != "go":
            raise ValueError(f"--sgf-dir writes Go records; the game is {game!r}")
        check_new_sgf_dir(sgf_dir)  # before the match, not after it
    set_threads(threads)
    dev = torch_device(device)
    main = lazy_model_agent(model, game, simulations, search, seed, dev)
    agent = main()
    g = agent.game  # the model's own board (a 7x7 Go model plays 7x7)
    rival = make_agent(opponent, game, main, simulations, search, seed + 1, dev)
    beat = Heartbeat(f"{agent.name} vs {rival.name}").beat
    result = play_match(g, agent, rival, games, seed=seed, opening_plies=opening_plies,
                        progress=lambda done, total, moves: beat(
                            f"{done}/{total} games finished, {moves} moves played"))
    if sgf_dir is not None:
        write_match_sgfs(g, result, sgf_dir)
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
    game: GameOption = "connect4",
    model: ModelOption = None,
    games: Annotated[int, typer.Option("--games", help="games per point")] = 100,
    max_simulations: Annotated[int, typer.Option("--max-simulations")] = 800,
    simulations: Annotated[str | None, typer.Option(
        "--simulations", help="comma-separated budgets (default 0,1,2,4,...,max)")] = None,
    out: Annotated[Path, typer.Option("--out")] = Path("runs/zero/compute_curve"),
    seed: SeedOption = 0,
    opening_plies: OpeningPliesOption = 2,
    search: SearchOption = "trained",
    threads: ThreadsOption = None,
    device: DeviceOption = "cpu",
) -> None:
    """The model with 0, 1, 2, 4, ... simulations against its raw policy: table + PNG."""
    from ..zero import compute_curve as curve_lib

    set_threads(threads)
    if simulations:
        try:
            budgets = [int(s) for s in simulations.split(",") if s.strip()]
        except ValueError:
            raise ValueError(
                f"bad --simulations {simulations!r}: integers, comma-separated"
            ) from None
    else:
        budgets = curve_lib.curve_simulations(max_simulations)
    agent = network_agent(model, game, 0, search, seed, device=torch_device(device))
    g = agent.game  # the model's own board (a 7x7 Go model plays 7x7)
    typer.echo(curve_lib.curve_table([]))

    def show(point):
        typer.echo(curve_lib.curve_table([point]).splitlines()[-1])

    points = curve_lib.compute_curve(g, agent, budgets, games, seed, opening_plies,
                                     on_point=show)
    png = curve_lib.write_compute_curve(points, out, title=f"{game}: search vs raw policy")
    typer.echo(f"wrote {out / 'curve.md'}, {out / 'curve.json'} and {png}")


@guarded
def solver_agreement(
    model: ModelOption = None,
    simulations: Annotated[int, typer.Option("--simulations")] = 400,
    files: Annotated[str, typer.Option("--files")] = "Test_L3_R1,Test_L2_R1,Test_L2_R2",
    limit: Annotated[int | None, typer.Option(
        "--limit", help="first N positions per file")] = None,
    agent_spec: Annotated[str, typer.Option(
        "--agent", help="model | raw | sims:N | random | mcts:N | solver")] = "model",
    data_dir: Annotated[Path | None, typer.Option(
        "--data-dir", help="default <repo>/../shared/data/connect4")] = None,
    seed: SeedOption = 0,
    search: SearchOption = "trained",
    threads: ThreadsOption = None,
    device: DeviceOption = "cpu",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Share of Connect Four benchmark positions where the move keeps the solver's value."""
    from ..zero.perfect_play import agreement_table
    from ..zero.perfect_play import solver_agreement as agreement

    set_threads(threads)
    dev = torch_device(device)
    main = lazy_model_agent(model, "connect4", simulations, search, seed, dev)
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
def elo_curve(
    run_dir: Annotated[Path, typer.Argument(help="a `rlscale zero train` run directory")],
    games: Annotated[int, typer.Option("--games", help="games per pairing")] = 20,
    simulations: Annotated[int, typer.Option(
        "--simulations", help="each checkpoint's search budget per move (0: raw)")] = 64,
    anchors: Annotated[str, typer.Option(
        "--anchors", help="fixed opponents, comma-separated (random, mcts:N, solver, "
        "model:PATH); the first is rated 0")] = "random,mcts:200",
    neighbours: Annotated[int, typer.Option(
        "--neighbours", help="later checkpoints each checkpoint plays")] = 2,
    out: Annotated[Path | None, typer.Option("--out", help="default RUN_DIR/elo_curve")] = None,
    seed: SeedOption = 0,
    opening_plies: OpeningPliesOption = 2,
    search: SearchOption = "trained",
    threads: ThreadsOption = None,
    device: DeviceOption = "cpu",
) -> None:
    """Elo of a run's checkpoints against each other and fixed anchors: table, JSON, CSV and
    a plot against iteration and self-play games."""
    from ..zero import elo_curve as curves
    from ..zero.network import read_meta

    set_threads(threads)
    dev = torch_device(device)
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
        return network_agent(c.path, game, simulations, search, seed, name=c.name, device=dev)

    def show(result):
        typer.echo(f"{result.agent_a} vs {result.agent_b}: W/D/L {result.wins}/{result.draws}/"
                   f"{result.losses} ({result.seconds:.0f} s)", err=True)

    curve = curves.elo_curve(checkpoints, load, rivals, games, seed, neighbours, opening_plies,
                             run_dir=run_dir, on_match=show)
    curve.settings.update(simulations=simulations, search=search, anchors=specs)
    paths = curves.write_elo_curve(curve, out or run_dir / "elo_curve")
    typer.echo(curves.elo_table(curve))
    typer.echo("wrote " + ", ".join(str(p) for p in paths))
