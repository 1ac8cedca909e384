"""Self-play games/hour against the number of self-play actors (zero/actors.py).

    .venv/bin/python benchmarks/selfplay_fleet.py [--config configs/zero/tictactoe.yaml]
        [--actors 0 1 2] [--seconds 60] [--repeats 1] [--json] [key=value ...]

For each actor count: 0 is in-process self-play (one `Actor` in this process, what
`runtime.actors: 0` runs); M > 0 is a fleet of M Ray actors (an embedded cluster), each with
`runtime.actor_threads` torch threads and `selfplay.concurrent_games` games in flight. No
learner runs: the weights are a fresh network's (search speed does not depend on them) and
only self-play is timed, so M actors x 1 thread fit M cores. After a warm-up (every actor
has delivered a game) the finished games are counted over `--seconds`; games/hour and
simulations/s are over that window. "cores used" is the CPU time the actor processes got
(from /proc; this process for in-process self-play) per second of the window, and
games/core-hour the games per hour of that CPU time: games/hour = cores used x games/core-hour,
which separates what the design scales from what a busy machine lends. "driver cores" is
the orchestrator's share (this process: receiving and queueing games). The load average is
printed with every row: on a shared machine the figures are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from rlscale.config import load_config
from rlscale.runtime.fleet import ray_session
from rlscale.runtime.versions import WeightStore
from rlscale.zero.actors import FleetSelfPlay
from rlscale.zero.config import ZeroConfig
from rlscale.zero.games import make_game
from rlscale.zero.network import network_for
from rlscale.zero.selfplay import Actor, PlayStats

REPO = Path(__file__).resolve().parents[1]


def in_process(cfg: ZeroConfig, seconds: float) -> dict[str, float]:
    torch.set_num_threads(cfg.runtime.actor_threads)
    game = make_game(cfg.game.name, **cfg.game.kwargs)
    torch.manual_seed(cfg.train.seed)
    net = network_for(game, cfg.network)
    actor = Actor(game, network_for(game, cfg.network), cfg.mcts, cfg.selfplay,
                  WeightStore(net.state_dict()), np.random.default_rng(cfg.train.seed))
    actor.sync()
    actor.play(1)  # warm-up
    stats, start, cpu = PlayStats(), time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        actor.step(stats)
    elapsed = time.perf_counter() - start
    return {"games": stats.games, "seconds": elapsed, "simulations": stats.simulations,
            "cpu_seconds": time.process_time() - cpu}


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of the processes `pids`, from /proc."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def fleet(cfg: ZeroConfig, seconds: float) -> dict[str, float]:
    torch.manual_seed(cfg.train.seed)
    net = network_for(make_game(cfg.game.name, **cfg.game.kwargs), cfg.network)
    selfplay = FleetSelfPlay(cfg, resign_threshold=cfg.selfplay.resign_threshold)
    selfplay.start(net.state_dict(), 0)
    acc = selfplay.accounting
    try:
        while len({index for index, _ in list(acc.delivered)}) < cfg.runtime.actors:
            time.sleep(0.05)  # warm-up: every actor up and playing
        pids = selfplay.worker_pids()
        selfplay.take(len(selfplay.queue))  # starts the measured window
        before, start, cpu = len(acc.delivered), time.perf_counter(), cpu_seconds(pids)
        driver = time.process_time()
        time.sleep(seconds)
        games, cpu = len(acc.delivered) - before, cpu_seconds(pids) - cpu
        driver = time.process_time() - driver
        _, stats, metrics = selfplay.take(len(selfplay.queue))
        elapsed = time.perf_counter() - start
    finally:
        selfplay.close()
    return {"games": games, "seconds": elapsed, "simulations": stats.simulations,
            "cpu_seconds": cpu, "driver_cpu_seconds": driver,
            "busy_share": metrics["fleet/actor_busy_share"]}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs/zero/tictactoe.yaml"))
    parser.add_argument("--actors", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()
    # Nothing waits for the queue to drain: actors never pause.
    base = load_config(ZeroConfig, args.config, ["runtime.max_queued_games=1000000000",
                                                 *args.overrides])
    rows = []
    with ray_session(num_cpus=max(os.cpu_count() or 1, max(args.actors))):
        for repeat in range(args.repeats):
            for actors in args.actors:
                cfg = base.model_copy(update={"runtime": base.runtime.model_copy(
                    update={"actors": actors})})
                load = os.getloadavg()[0]
                result = (fleet if actors else in_process)(cfg, args.seconds)
                rows.append({"actors": actors, "repeat": repeat, "load_before": load,
                             "load_after": os.getloadavg()[0], **result,
                             "games_per_hour": result["games"] / result["seconds"] * 3600,
                             "simulations_per_s": result["simulations"] / result["seconds"]})
                print(f"actors {actors}: {rows[-1]['games_per_hour']:,.0f} games/hour", flush=True)
    one = {r["repeat"]: r["games_per_hour"] for r in rows if r["actors"] == 1}
    s, sp = base.mcts.simulations, base.selfplay
    print(f"\n{base.game.name}, {s} simulations/move, {sp.concurrent_games} games in flight "
          f"per actor, network {base.network.blocks}x{base.network.channels}, "
          f"{base.runtime.actor_threads} thread(s) per actor; {cpu_name()}, "
          f"{os.cpu_count()} cores\n")
    print("| actors | games/hour | vs 1 actor | simulations/s | cores used | games/core-hour "
          "| driver cores | load avg before/after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ratio = f"{r['games_per_hour'] / one[r['repeat']]:.2f}x" if r["repeat"] in one else "-"
        driver = f"{r['driver_cpu_seconds'] / r['seconds']:.2f}" if "driver_cpu_seconds" in r else "-"
        label = "0 (in-process)" if r["actors"] == 0 else str(r["actors"])
        print(f"| {label} | {r['games_per_hour']:,.0f} | {ratio} | "
              f"{r['simulations_per_s']:,.0f} | {r['cpu_seconds'] / r['seconds']:.2f} | "
              f"{r['games'] / max(r['cpu_seconds'], 1e-9) * 3600:,.0f} | {driver} | "
              f"{r['load_before']:.1f} / {r['load_after']:.1f} |")
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
