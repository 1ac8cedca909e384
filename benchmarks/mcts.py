"""Search speed on Connect Four, next to the raw network and to OpenSpiel, in one run.

    .venv/bin/python benchmarks/mcts.py [--model PATH] [--simulations 200] [--seconds 3]
                                        [--rollouts 1000] [--threads 1] [--json]

Measures, on the same machine in the same process:
- the network's raw forward pass, positions/s at batch 1, 64 and 256;
- the network search (its saved settings, or --search puct|gumbel), simulations/s with 1 and
  with 64 concurrent games (one batched network call per simulation step over all trees),
  and that rate as a share of the raw rate at the same batch (the search's own overhead);
- both again with the network on CUDA when torch sees a GPU (`evaluate` moves each batch
  there and the results back, as self-play does); otherwise a line says they were skipped;
- pure MCTS (UCT, random playouts) with `--rollouts` simulations per move: ours, and, if
  OpenSpiel is importable, OpenSpiel's MCTSBot (RandomRolloutEvaluator, one rollout per
  simulation, solve=False, the same uct_c) on the same positions, as simulations/s and ratio.

The model is the shipped one (`src/rlscale/zero/models/connect4`) or `--model`; without
either, a freshly initialised network of `configs/zero/connect4.yaml`'s architecture (speed
does not depend on the weights).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from rlscale.zero.agents import NetworkAgent, PureMCTSAgent, load_network_agent
from rlscale.zero.games import make_game
from rlscale.zero.model import shipped_model
from rlscale.zero.search import search_states
from rlscale.zero.uct import DEFAULT_UCT_C

REPO = Path(__file__).resolve().parents[1]


def positions(game, count: int, rng: np.random.Generator, max_plies: int = 12) -> list:
    """`count` non-terminal positions after 0..max_plies random moves."""
    out = []
    while len(out) < count:
        state = game.initial_state()
        for _ in range(int(rng.integers(max_plies + 1))):
            legal = np.flatnonzero(game.legal_mask(state))
            state = game.apply(state, int(legal[rng.integers(legal.size)]))
            if game.is_terminal(state):
                break
        if not game.is_terminal(state):
            out.append(state)
    return out


def timed(fn, seconds: float, min_repeats: int = 2, cuda: bool = False) -> tuple[int, float]:
    """Call fn() until `seconds` have passed (at least min_repeats times): (calls, seconds).
    `cuda`: synchronise before the clock starts and before it stops, so queued GPU work is
    counted in the calls that queued it."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()  # warm-up (on a GPU also the kernels' first launch)
    sync()
    calls, start = 0, time.perf_counter()
    while calls < min_repeats or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    sync()
    return calls, time.perf_counter() - start


def network_rows(game, net, mcts, pool: list, simulations: int, seconds: float,
                 rng: np.random.Generator, where: str = "") -> list[dict]:
    """The raw forward at batch 1, 64, 256 and the network search with 1 and 64 trees, for
    `net` on the device it is on; `where` is appended to the row names (e.g. ", cuda")."""
    cuda = net.device.type == "cuda"
    rows, raw = [], {}
    for batch in (1, 64, 256):
        planes = np.stack([game.planes(s) for s in pool[:batch]])
        calls, secs = timed(lambda planes=planes: net.evaluate(planes), seconds, cuda=cuda)
        raw[batch] = calls * batch / secs
        rows.append({"what": f"network forward (raw{where})", "batch": batch,
                     "rate": raw[batch], "unit": "positions/s"})

    kind = "gumbel" if mcts.gumbel else "puct"
    for trees in (1, 64):
        states = pool[:trees]

        def run(states=states):
            search_states(game, states, net.evaluate, mcts, rng, simulations=simulations)

        calls, secs = timed(run, seconds, cuda=cuda)
        rate = calls * trees * simulations / secs
        rows.append({"what": f"network search ({kind}, {simulations} sims{where})",
                     "batch": trees, "rate": rate, "unit": "simulations/s",
                     "vs": f"{100 * rate / raw[trees]:.0f}% of raw batch-{trees} rate"})
    return rows


def load_agent_or_fresh(model: str | None, search: str):
    if model:
        return load_network_agent(model, 0, game="connect4", search=search), model
    path = shipped_model("connect4")
    if (path / "model.json").is_file():
        return load_network_agent(path, 0, game="connect4", search=search), str(path)
    from rlscale.config import load_config
    from rlscale.zero.config import ZeroConfig
    from rlscale.zero.model import Model
    from rlscale.zero.network import network_for

    cfg = load_config(ZeroConfig, REPO / "configs" / "zero" / "connect4.yaml")
    game = make_game("connect4")
    net = network_for(game, cfg.network).eval()
    mcts = cfg.mcts if search == "trained" else cfg.mcts.model_copy(
        update={"gumbel": search == "gumbel"})
    return NetworkAgent(Model(game, net, mcts), 0), "fresh network (no model found)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--search", default="trained", choices=["trained", "puct", "gumbel"])
    parser.add_argument("--simulations", type=int, default=200, help="network search budget")
    parser.add_argument("--rollouts", type=int, default=1000, help="pure-MCTS simulations")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    game = make_game("connect4")
    agent, source = load_agent_or_fresh(args.model, args.search)
    net, mcts = agent.model.net, agent.model.mcts
    pool = positions(game, 256, rng)
    rows = network_rows(game, net, mcts, pool, args.simulations, args.seconds, rng)
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
        rows += network_rows(game, copy.deepcopy(net).to("cuda"), mcts, pool, args.simulations,
                             args.seconds, rng, where=", cuda")
    else:
        gpu = None

    spots = pool[:8]
    ours = PureMCTSAgent(args.rollouts, seed=args.seed)
    calls, secs = timed(lambda: [ours.act(game, s) for s in spots], args.seconds, 1)
    ours_rate = calls * len(spots) * args.rollouts / secs
    rows.append({"what": f"pure MCTS, ours (UCT c={DEFAULT_UCT_C}, random playouts)",
                 "batch": 1, "rate": ours_rate, "unit": "simulations/s"})
    try:
        import pyspiel
        from open_spiel.python.algorithms import mcts as spiel_mcts
    except ImportError:
        rows.append({"what": "OpenSpiel MCTSBot", "batch": 1, "rate": None,
                     "unit": "simulations/s", "vs": "OpenSpiel not importable"})
    else:
        spiel_game = pyspiel.load_game("connect_four")
        random_state = np.random.RandomState(args.seed)
        bot = spiel_mcts.MCTSBot(
            spiel_game, DEFAULT_UCT_C, args.rollouts,
            spiel_mcts.RandomRolloutEvaluator(1, random_state), solve=False,
            random_state=random_state,
        )
        spiel_states = []
        for s in spots:
            st = spiel_game.new_initial_state()
            for ch in s.moves:  # connect_four actions are the columns 0..6, like ours
                st.apply_action(int(ch) - 1)
            spiel_states.append(st)
        calls, secs = timed(lambda: [bot.step(st) for st in spiel_states], args.seconds, 1)
        spiel_rate = calls * len(spots) * args.rollouts / secs
        rows.append({"what": "pure MCTS, OpenSpiel MCTSBot (python, random rollouts)",
                     "batch": 1, "rate": spiel_rate, "unit": "simulations/s",
                     "vs": f"ours / OpenSpiel = {ours_rate / spiel_rate:.2f}x"})

    skipped = "GPU rows skipped: torch.cuda.is_available() is False"
    info = {"model": source, "threads": args.threads, "machine": platform.processor() or
            platform.machine(), "gpu": gpu or skipped, "torch": torch.__version__, "rows": rows}
    if args.json:
        print(json.dumps(info, indent=2))
        return
    print(f"Connect Four search speed; model: {source}; torch threads: {args.threads}; "
          f"GPU: {gpu or 'none'}")
    print("| measurement | batch / games | rate | unit | note |")
    print("| --- | ---: | ---: | --- | --- |")
    for r in rows:
        rate = f"{r['rate']:,.0f}" if r["rate"] is not None else "n/a"
        print(f"| {r['what']} | {r['batch']} | {rate} | {r['unit']} | {r.get('vs', '')} |")
    if gpu is None:
        print(skipped)


if __name__ == "__main__":
    main()
