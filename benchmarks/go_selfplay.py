"""Go self-play speed against the network's own limit, and where the rest of the time goes.

    .venv/bin/python benchmarks/go_selfplay.py [--recipe NAME=PATH[,key=value,...] ...]
        [--precision float32 bfloat16 | auto] [--threads 2] [--seconds 60]
        [--breakdown-seconds 20] [--limit-seconds 4] [--warmup-steps 1]
        [--plies-per-game 42] [--device cpu] [--out runs/bench_go_selfplay] [key=value ...]

    # old recipe against new, side by side in one run:
    .venv/bin/python benchmarks/go_selfplay.py --recipe old=configs/zero/go7.yaml \
        --recipe new=configs/zero/go7.yaml,mcts.simulations=64

Without --recipe the one recipe is `configs/zero/go7.yaml` as it is. A recipe is a config
file plus dotted overrides after commas (a value holding a comma cannot be given this way);
the trailing `key=value` arguments apply to every recipe, before its own overrides.

For each recipe and precision (`--precision`: float32, bfloat16, or auto, which the matmul
probe of runtime/device.py resolves at `--threads`), in one process at `--threads` torch
threads, an in-process `Actor` (zero/selfplay.py, what `runtime.actors: 0` runs) with a fresh
network, or a trained one with `network.init_from=PATH` (a trained net concentrates its visits,
so its trees are deeper and the tree's share grows; game length changes too), plays:

1. `--warmup-steps` batched moves of every game in flight (compilation, first calls);
2. the measured window: batched moves until `--seconds` have passed, uninstrumented. From it:
   simulations/s (the search budgets spent), network positions/s (leaves and fresh roots
   evaluated), and games/hour = 3600 x searched moves/s / `--plies-per-game`. The window is
   far shorter than a game, and every game in flight starts together, so the games that do
   finish in it are the shortest ones: their count and mean length are printed beside the
   estimate, not used for it. The default 42 plies is the mean game length of go7's first
   iteration (a fresh network, docs/go_model_card.md); a trained net resigns earlier (31-37);
3. the limit: the network alone, `net(planes)` under torch.inference_mode and the same
   autocast as self-play (runtime.device.compute_context), at the batch self-play used (its
   position-weighted mean batch), on planes self-play built, for `--limit-seconds`; and the
   same through `net.evaluate` (numpy in, softmax, numpy out) for the conversion cost. Self-
   play's simulations/s and positions/s are printed as a % of the forward rate, and (in
   brackets) positions per CPU second of this process as a % of the forward's: on a busy
   machine the other jobs take different shares of the two measurements, and that ratio
   cancels them (with more threads than free cores it still carries the spin-waiting);
4. the breakdown window (`--breakdown-seconds`, 0 skips it): the same moves with explicit
   timers around the hot functions of the search (zero/mcts.py, forest.py, puct.py,
   gumbel.py), zero/selfplay.py, zero/network.py and the game (patched here, restored
   after; src/ is not changed). Each timer charges only its own
   (exclusive) time, so the categories partition the window's wall time exactly:
   network forward | batching & features (game.planes, np.stack, evaluate's tensor
   conversion and softmax, prior masking) | tree (search, select, expand, backup, Gumbel root,
   Forest.advance/reset) | game kernels (the numba `_play`, `_legal`, `_area`) | game rules in
   Python around them (GoState, apply, legal_mask, is_terminal...) | rest (the self-play
   loop's own Python: per-game bookkeeping, recording samples). The timers cost ~1-2 us per
   call (about ten calls per leaf); the instrumented window's simulations/s is printed so
   their cost shows.

Also printed: the CPU model, the cores this process may use, the SIMD/matrix flags that decide
the precision question (avx2, avx512f, avx512_bf16, avx512_fp16, amx_*), the load average,
and "cores used" (this process's CPU seconds per wall second): on a shared machine the
figures move with the other jobs, and that column says how much of the cores self-play got.
A markdown table goes to stdout and everything to `<out>/results.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlscale.config import load_config
from rlscale.runtime.device import compute_context, resolve_compute_dtype, resolve_device
from rlscale.runtime.versions import WeightStore
from rlscale.zero import forest as forest_module
from rlscale.zero import gumbel as gumbel_module
from rlscale.zero import mcts as mcts_module
from rlscale.zero import puct as puct_module
from rlscale.zero import selfplay as selfplay_module
from rlscale.zero.config import ZeroConfig
from rlscale.zero.games import make_game
from rlscale.zero.loop import initial_network
from rlscale.zero.network import PolicyValueNet, network_for, precision_workload, selfplay_batch
from rlscale.zero.selfplay import Actor, PlayStats

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = f"go7={REPO / 'configs/zero/go7.yaml'}"
# Mean game length of go7's first iteration, a fresh network (docs/go_model_card.md).
DEFAULT_PLIES_PER_GAME = 42.0
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
             "amx_bf16", "amx_fp16", "amx_int8", "amx_tile")

NETWORK = "network forward"
BATCHING = "batching & features"
TREE = "tree"
KERNELS = "game kernels (numba)"
RULES = "game rules (Python)"
REST = "rest (Python)"
CATEGORIES = (NETWORK, BATCHING, TREE, KERNELS, RULES, REST)

# (module or class, attribute, category) of the functions the breakdown times. A function is
# timed where its callers look it up: children_stats once per module that calls it.
SEARCH_FUNCTIONS = (
    (selfplay_module, "search", TREE),  # the search's own body (virtual loss, passes, noise)
    (mcts_module, "_select", TREE),
    (mcts_module, "_expand", TREE),
    (mcts_module, "_backup", TREE),
    (mcts_module, "root_stats", TREE),
    (mcts_module, "search_result", TREE),
    (mcts_module, "children_stats", TREE),
    (puct_module, "puct_scores", TREE),
    (puct_module, "children_stats", TREE),
    (gumbel_module, "completed_q", TREE),
    (gumbel_module, "gumbel_scores", TREE),
    (gumbel_module, "children_stats", TREE),
    (forest_module.Forest, "advance", TREE),
    (forest_module.Forest, "reset", TREE),
    (forest_module.Forest, "_set_node", TREE),
    (forest_module.Forest, "ensure_capacity", TREE),
    (mcts_module, "_evaluate", BATCHING),  # np.stack of the planes, dtype conversions
    (mcts_module, "_masked_priors", BATCHING),
    (selfplay_module, "policy_kl", REST),
    (Actor, "_finish", REST),
    (Actor, "_new_game", REST),
)
GAME_METHODS = ("apply", "legal_mask", "is_terminal", "to_play", "outcome", "score", "area")
GO_KERNELS = ("_play", "_legal", "_area")


# -- what is measured ------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    name: str
    path: str
    overrides: tuple[str, ...]


def parse_recipe(text: str) -> Recipe:
    """`NAME=path.yaml[,key=value,...]` (a bare path is named after its file)."""
    head, *overrides = text.split(",")
    name, sep, path = head.partition("=")
    if not sep:
        name, path = Path(head).stem, head
    if not name or not path:
        raise SystemExit(f"error: --recipe {text!r} is not NAME=path.yaml[,key=value,...]")
    return Recipe(name, path, tuple(o for o in overrides if o))


@dataclass
class BatchLog:
    """Every network call of self-play: its batch size, and the largest batch's planes (what
    the limit is measured on)."""

    sizes: list[int] = field(default_factory=list)
    largest: np.ndarray | None = None

    def wrap(self, evaluate: Callable) -> Callable:
        def logged(planes: np.ndarray):
            self.sizes.append(len(planes))
            if self.largest is None or len(planes) >= len(self.largest):
                self.largest = planes
            return evaluate(planes)
        return logged


def weighted_batch(sizes: list[int]) -> float:
    """The batch the average position was evaluated in (each call weighted by its size)."""
    array = np.asarray(sizes, np.float64)
    return float((array**2).sum() / max(array.sum(), 1.0))


class SelfTimer:
    """Exclusive (self) time per label: a call's time is charged to the innermost timed
    function running, so the labels partition the wall time between `start` and `stop`."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack = [base]
        self._last = time.perf_counter()

    def _charge(self) -> None:
        now = time.perf_counter()
        top = self._stack[-1]
        self.seconds[top] = self.seconds.get(top, 0.0) + now - self._last
        self._last = now

    def start(self) -> None:
        self.seconds, self.calls, self._stack = {}, {}, [self.base]
        self._last = time.perf_counter()

    def stop(self) -> None:
        self._charge()

    def wrap(self, label: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._charge()
            self._stack.append(label)
            self.calls[label] = self.calls.get(label, 0) + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._charge()
                self._stack.pop()
        return timed


@dataclass(frozen=True)
class Window:
    """What the games did in a stretch of batched moves."""

    steps: int
    seconds: float
    cpu_seconds: float
    searched_moves: int  # one per game in flight per step
    simulations: int
    positions: int  # evaluated by the network (leaves and fresh roots)
    games_finished: int
    finished_plies: list[int]

    def rate(self, count: float) -> float:
        return count / self.seconds


@dataclass(frozen=True)
class Limit:
    batch: int
    forward_positions_per_s: float
    forward_positions_per_cpu_s: float  # per CPU second of this process: less load-bound
    evaluate_positions_per_s: float


# -- measuring -------------------------------------------------------------------------------


def build_actor(cfg: ZeroConfig, dtype: str, device: torch.device) -> tuple[Actor, BatchLog]:
    """A self-play actor as in-process training builds it (zero/loop.py), with a fresh
    network or the one `network.init_from` names (a trained net searches deeper trees and
    plays shorter games), and the log of its network calls."""
    game = make_game(cfg.game.name, **cfg.game.kwargs)
    torch.manual_seed(cfg.train.seed)
    net = initial_network(cfg, game)
    net.compute_dtype = dtype
    net = net.to(device).eval()
    actor = Actor(game, net, cfg.mcts, cfg.selfplay, WeightStore(net.state_dict()),
                  np.random.default_rng([cfg.train.seed, 1]))
    actor.sync()
    log = BatchLog()
    net.evaluate = log.wrap(net.evaluate)  # an instance attribute: the Actor calls this one
    return actor, log


def play_window(actor: Actor, log: BatchLog, seconds: float, min_steps: int = 1) -> Window:
    """Batched moves until `seconds` have passed (at least `min_steps`)."""
    stats, first_call = PlayStats(), len(log.sizes)
    start, cpu = time.perf_counter(), time.process_time()
    steps = 0
    while steps < min_steps or time.perf_counter() - start < seconds:
        actor.step(stats)
        steps += 1
    elapsed = time.perf_counter() - start
    return Window(steps, elapsed, time.process_time() - cpu, stats.moves, stats.simulations,
                  int(sum(log.sizes[first_call:])), stats.games, list(stats.lengths))


def _timed_calls(fn: Callable[[], Any], seconds: float,
                 sync: Callable[[], None]) -> tuple[int, float, float]:
    """(calls, wall seconds, CPU seconds of this process) of calling fn for `seconds`."""
    fn()
    fn()  # warm-up: kernel choice, allocations
    sync()
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while calls < 2 or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    sync()
    return calls, time.perf_counter() - start, time.process_time() - cpu


def batch_of(planes: np.ndarray, batch: int) -> np.ndarray:
    """`batch` positions from `planes`, repeated when there are fewer."""
    return np.ascontiguousarray(np.resize(planes, (batch, *planes.shape[1:])))


def network_limit(net: PolicyValueNet, evaluate: Callable, planes: np.ndarray, dtype: str,
                  seconds: float) -> Limit:
    """The network's own rate at self-play's batch: the raw forward (inference mode, self-play's
    autocast), and through `evaluate` (numpy in and out, softmax)."""
    device = net.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    x = torch.from_numpy(planes).to(device)

    def forward() -> None:
        with torch.inference_mode(), compute_context(device, dtype):
            net(x)

    net.eval()
    calls, secs, cpu = _timed_calls(forward, seconds, sync)
    forward_rate, forward_cpu_rate = calls * len(planes) / secs, calls * len(planes) / cpu
    calls, secs, _ = _timed_calls(lambda: evaluate(planes), seconds, sync)
    return Limit(len(planes), forward_rate, forward_cpu_rate, calls * len(planes) / secs)


def timed_functions(actor: Actor) -> list[tuple[Any, str, str, str]]:
    """(owner, attribute, label, category) of everything the breakdown times."""
    out = [(owner, name, f"{getattr(owner, '__name__', '?').rsplit('.', 1)[-1]}.{name}", cat)
           for owner, name, cat in SEARCH_FUNCTIONS]
    game_class = type(actor.game)
    for name in GAME_METHODS:
        if name in vars(game_class):
            out.append((game_class, name, f"{game_class.__name__}.{name}", RULES))
    if "planes" in vars(game_class):
        out.append((game_class, "planes", f"{game_class.__name__}.planes", BATCHING))
    kernels = sys.modules[game_class.__module__]
    for name in GO_KERNELS:
        if hasattr(kernels, name):
            out.append((kernels, name, f"{kernels.__name__.rsplit('.', 1)[-1]}.{name}", KERNELS))
    return out


@contextlib.contextmanager
def instrumented(actor: Actor, timer: SelfTimer) -> Iterator[dict[str, str]]:
    """Timers around the hot functions (class and module attributes, and the actor's network
    calls) for the duration; yields label -> category. Restores every original on exit."""
    patched, categories = [], {}
    net = actor.net
    logged_evaluate = net.evaluate  # BatchLog's wrapper (build_actor)
    sync = (lambda: torch.cuda.synchronize(net.device)) if net.device.type == "cuda" else None
    try:
        for owner, name, label, category in timed_functions(actor):
            original = vars(owner)[name]
            patched.append((owner, name, original))
            setattr(owner, name, timer.wrap(label, original))
            categories[label] = category
        forward = net.forward
        if sync is not None:  # count the GPU's work where it is queued, not at the copy back
            def forward(x, _forward=net.forward):
                out = _forward(x)
                sync()
                return out
        net.forward = timer.wrap("PolicyValueNet.forward", forward)
        net.evaluate = timer.wrap("PolicyValueNet.evaluate", logged_evaluate)
        categories["PolicyValueNet.forward"] = NETWORK
        categories["PolicyValueNet.evaluate"] = BATCHING
        categories[timer.base] = REST
        yield categories
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)
        if "forward" in vars(net):
            del net.forward
        net.evaluate = logged_evaluate


def breakdown(actor: Actor, log: BatchLog, seconds: float) -> tuple[Window, dict[str, Any]]:
    """A window with the timers on: its figures, the share of wall time per category and the
    self time and calls of every timed function."""
    timer = SelfTimer("Actor.step and the rest")
    with instrumented(actor, timer) as categories:
        timer.start()
        window = play_window(actor, log, seconds)
        timer.stop()
    total = sum(timer.seconds.values())
    shares = dict.fromkeys(CATEGORIES, 0.0)
    for label, secs in timer.seconds.items():
        shares[categories[label]] += secs / total
    functions = {
        label: {"category": categories[label], "seconds": secs, "share": secs / total,
                "calls": timer.calls.get(label, 0),
                "us_per_call": 1e6 * secs / max(timer.calls.get(label, 0), 1)}
        for label, secs in sorted(timer.seconds.items(), key=lambda kv: -kv[1])
    }
    return window, {"shares": shares, "functions": functions, "timed_seconds": total}


# -- one cell: a recipe in a precision ---------------------------------------------------------


def recipe_config(recipe: Recipe, common: list[str]) -> ZeroConfig:
    return load_config(ZeroConfig, recipe.path, [*common, *recipe.overrides])


def describe(cfg: ZeroConfig) -> dict[str, Any]:
    return {"game": cfg.game.name, "game_kwargs": cfg.game.kwargs,
            "network": f"{cfg.network.blocks}x{cfg.network.channels}",
            "simulations": cfg.mcts.simulations, "gumbel": cfg.mcts.gumbel,
            "leaves_per_call": cfg.mcts.leaves_per_call,
            "concurrent_games": cfg.selfplay.concurrent_games,
            "fast_simulations": cfg.selfplay.fast_simulations}


def rates(window: Window, plies_per_game: float) -> dict[str, float]:
    return {"simulations_per_s": window.rate(window.simulations),
            "positions_per_s": window.rate(window.positions),
            "searched_moves_per_s": window.rate(window.searched_moves),
            "games_per_hour": window.rate(window.searched_moves) * 3600 / plies_per_game,
            "cores_used": window.cpu_seconds / window.seconds}


def measure_cell(recipe: Recipe, cfg: ZeroConfig, precision: str, args: argparse.Namespace,
                 device: torch.device) -> dict[str, Any]:
    probe_net = network_for(make_game(cfg.game.name, **cfg.game.kwargs), cfg.network).to(device)
    resolved = resolve_compute_dtype(precision, device, precision_workload(
        probe_net, selfplay_batch(cfg.selfplay.concurrent_games, cfg.mcts.leaves_per_call)))
    dtype = resolved.name
    print(f"[{recipe.name}, {precision}{'' if precision == dtype else f' -> {dtype}'}] "
          f"{resolved.describe()}", flush=True)
    load_before = os.getloadavg()[0]
    actor, log = build_actor(cfg, dtype, device)
    warm = play_window(actor, log, 0.0, min_steps=args.warmup_steps)
    first_call = len(log.sizes)
    window = play_window(actor, log, args.seconds)
    sizes = log.sizes[first_call:]
    batch = max(1, round(weighted_batch(sizes)))
    limit = network_limit(actor.net, actor.net.evaluate, batch_of(log.largest, batch), dtype,
                          args.limit_seconds)
    cell: dict[str, Any] = {
        "recipe": recipe.name, "path": recipe.path, "overrides": list(recipe.overrides),
        "config": describe(cfg), "precision": precision, "compute_dtype": dtype,
        "threads": torch.get_num_threads(), "device": str(device),
        "warmup": asdict(warm), "window": asdict(window),
        **rates(window, args.plies_per_game),
        "plies_per_game": args.plies_per_game,
        "games_finished": window.games_finished,
        "finished_mean_plies": float(np.mean(window.finished_plies)) if window.finished_plies
        else None,
        "batch": {"weighted_mean": weighted_batch(sizes), "calls": len(sizes),
                  "min": min(sizes), "median": float(np.median(sizes)), "max": max(sizes)},
        "limit": asdict(limit),
    }
    cell["simulations_vs_limit"] = cell["simulations_per_s"] / limit.forward_positions_per_s
    cell["positions_vs_limit"] = cell["positions_per_s"] / limit.forward_positions_per_s
    # The same per CPU second on both sides: what a busy machine's other jobs took cancels.
    cell["positions_vs_limit_per_cpu_s"] = (window.positions / window.cpu_seconds
                                            / limit.forward_positions_per_cpu_s)
    if args.breakdown_seconds > 0:
        timed_window, split = breakdown(actor, log, args.breakdown_seconds)
        cell["breakdown"] = {**split, "window": asdict(timed_window),
                             **{f"instrumented_{k}": v for k, v in
                                rates(timed_window, args.plies_per_game).items()}}
    cell["load_before"], cell["load_after"] = load_before, os.getloadavg()[0]
    print(f"  {cell['simulations_per_s']:,.0f} simulations/s, {cell['positions_per_s']:,.0f} "
          f"positions/s = {100 * cell['positions_vs_limit']:.0f}% of the network's "
          f"{limit.forward_positions_per_s:,.0f} at batch {batch}", flush=True)
    return cell


# -- the machine and the tables ----------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("model name")), platform.processor() or "?")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines()
                      if line.startswith("flags")), []))
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "logical_cpus": os.cpu_count(), "usable_cpus": usable,
            "flags": {name: name in flags for name in CPU_FLAGS},
            "torch": torch.__version__, "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_average": list(os.getloadavg())}


def _label(cell: dict[str, Any]) -> str:
    dtype = cell["compute_dtype"]
    return f"{cell['recipe']}, {dtype if cell['precision'] == dtype else 'auto=' + dtype}"


def _mean_plies(cell: dict[str, Any]) -> str:
    mean = cell["finished_mean_plies"]
    return f"{cell['games_finished']}" + (f" ({mean:.0f})" if mean is not None else "")


def render(machine: dict[str, Any], cells: list[dict[str, Any]], top: int = 8) -> str:
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in machine["flags"].items())
    lines = [f"{machine['cpu']}; {machine['usable_cpus']} usable of {machine['logical_cpus']} "
             f"logical CPUs; torch {machine['torch']}; flags: {flags}; load average at start "
             f"{machine['load_average'][0]:.1f}", ""]
    for cell in cells:
        c = cell["config"]
        lines.append(f"- {cell['recipe']}: {cell['path']} {' '.join(cell['overrides'])} — "
                     f"{c['game']} {c['game_kwargs']}, net {c['network']}, "
                     f"{c['simulations']} simulations{' (Gumbel)' if c['gumbel'] else ''}, "
                     f"{c['concurrent_games']} games in flight")
    lines += ["", "| recipe, dtype | threads | games/hour (est.) | finished in window (mean "
              "plies) | simulations/s | positions/s | batch | network limit, positions/s "
              "(via evaluate) | simulations/s vs limit | positions/s vs limit (per CPU-second) "
              "| cores used | load before/after |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for cell in cells:
        limit = cell["limit"]
        lines.append(
            f"| {_label(cell)} | {cell['threads']} | {cell['games_per_hour']:,.0f} | "
            f"{_mean_plies(cell)} | {cell['simulations_per_s']:,.0f} | "
            f"{cell['positions_per_s']:,.0f} | {limit['batch']} | "
            f"{limit['forward_positions_per_s']:,.0f} ({limit['evaluate_positions_per_s']:,.0f})"
            f" | {100 * cell['simulations_vs_limit']:.0f}% | "
            f"{100 * cell['positions_vs_limit']:.0f}% "
            f"({100 * cell['positions_vs_limit_per_cpu_s']:.0f}%) | {cell['cores_used']:.2f} | "
            f"{cell['load_before']:.1f} / {cell['load_after']:.1f} |")
    lines.append(f"\ngames/hour = 3600 x searched moves/s / {cells[0]['plies_per_game']:g} "
                 "plies per game (--plies-per-game); the games finished in the short window "
                 "are the shortest ones, shown only.")
    timed = [cell for cell in cells if "breakdown" in cell]
    if not timed:
        return "\n".join(lines)
    lines += ["", "Self-play time, shares of the instrumented window's wall time:", "",
              "| | " + " | ".join(_label(c) for c in timed) + " |",
              "| --- |" + " ---: |" * len(timed)]
    for category in CATEGORIES:
        lines.append(f"| {category} | " + " | ".join(
            f"{100 * c['breakdown']['shares'][category]:.1f}%" for c in timed) + " |")
    lines.append("| simulations/s with the timers on | " + " | ".join(
        f"{c['breakdown']['instrumented_simulations_per_s']:,.0f}" for c in timed) + " |")
    for cell in timed:
        sims = max(cell["breakdown"]["window"]["simulations"], 1)
        lines += ["", f"Top functions by self time, {_label(cell)}:", "",
                  "| function | category | share | calls per simulation | us per call |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for label, f in list(cell["breakdown"]["functions"].items())[:top]:
            lines.append(f"| {label} | {f['category']} | {100 * f['share']:.1f}% | "
                         f"{f['calls'] / sims:.2f} | {f['us_per_call']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", action="append", default=None,
                        help="NAME=path.yaml[,key=value,...]; repeat to compare (default: "
                             "go7=configs/zero/go7.yaml)")
    parser.add_argument("--precision", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window per cell")
    parser.add_argument("--breakdown-seconds", type=float, default=20.0,
                        help="instrumented window per cell (0: no breakdown)")
    parser.add_argument("--limit-seconds", type=float, default=4.0,
                        help="per network-limit measurement")
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--plies-per-game", type=float, default=DEFAULT_PLIES_PER_GAME)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_go_selfplay"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every recipe")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    recipes = [parse_recipe(text) for text in (args.recipe or [DEFAULT_RECIPE])]
    configs = [recipe_config(r, args.overrides) for r in recipes]  # fail before measuring
    machine = machine_info()
    cells = [measure_cell(recipe, cfg, precision, args, device)
             for recipe, cfg in zip(recipes, configs, strict=True)
             for precision in args.precision]
    print()
    print(render(machine, cells))
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine, "args": {k: str(v) if isinstance(v, Path) else v
                                            for k, v in vars(args).items()}, "cells": cells}
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
