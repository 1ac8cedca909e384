"""Arms trained at once: `rlscale experiments run NAME --jobs N` trains up to N (arm, seed)
runs side by side, each in a worker process of its own, so an experiment of many arms can use
a machine of many cores. Each run is the one `--jobs 1` trains: the same config, seed and
run folder (a finished run is reused, a killed one resumes from its checkpoint). Measurements
that take as long as training (matches between networks, GRPO trained at a Zero run's budget)
are judged at once the same way (`judge_at_once`), one seed or one match a worker.

What several arms read is built first, here, one at a time (their own SFT bases, fine-tuned
teachers), so two workers never build the same thing. Arms on the asynchronous fleets are
trained here afterwards, one after another: their inference workers are processes of their
own, and they share one Ray session.

A worker gets `cores / N` threads unless OMP_NUM_THREADS says otherwise; a Zero config's
`train.threads` (Zero configs name theirs) is capped at that share, since two 2-thread runs on
2 cores spin-wait on each other (the first Connect Four iteration of zero_compute took 500 s
so, with a test run beside it). A worker is spawned, not forked, so torch and Ray start clean
in it."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ..runtime.checkpoint import atomic_write_text
from ..runtime.rundir import run_in_flight
from .setup import Context, arm_run_dir, on_fleets, shared_inputs, train_arms, train_one

PROGRESS_SECONDS = 300.0  # between the lines that say where the runs in flight are
JUDGED_DIR = "judged"  # under OUT: judgements kept as they come back (judge_at_once)
Item = TypeVar("Item")
Judged = TypeVar("Judged")


def worker_threads(jobs: int, cores: int | None = None) -> int:
    """Threads for each of `jobs` workers on `cores` cores (at least one)."""
    return max(1, (cores or os.cpu_count() or 1) // jobs)


def check_jobs(jobs: int) -> None:
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")


def _start_worker(threads: int) -> None:
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)


def _worker_pool(jobs: int, threads: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(threads,))


def judge_at_once(ctx: Context, judge: Callable[[Item], Judged], items: Sequence[Item],
                  saved_as: Callable[[Item], str] | None = None) -> list[Judged]:
    """`judge(item)` for each of `items`, in their order: up to `ctx.jobs` at once, each in a
    worker process with `ctx.threads` threads, or one after another here with `--jobs 1`.
    `judge` is sent to the workers, so it is a module's function (or a partial of one); the
    first judgement that fails stops the ones not started and raises its error.

    `saved_as(item)`: a file name under OUT/judged/ where the judgement (JSON) is kept as soon
    as it comes back, so a rerun after a crash or a kill loads it instead of judging again
    (unless --overwrite). The name must say everything the judgement depends on."""
    paths = [ctx.out / JUDGED_DIR / f"{saved_as(item)}.json" if saved_as else None
             for item in items]
    judged: list[Any] = [None] * len(items)
    todo = []
    for i, path in enumerate(paths):
        if path is not None and path.is_file() and not ctx.overwrite:
            judged[i] = json.loads(path.read_text())
        else:
            todo.append(i)

    def keep(i: int, judgement: Any) -> None:
        judged[i] = judgement
        if paths[i] is not None:
            paths[i].parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(paths[i], json.dumps(judgement, indent=1) + "\n")

    if ctx.jobs == 1 or len(todo) < 2:
        for i in todo:
            keep(i, judge(items[i]))
        return judged
    with _worker_pool(min(ctx.jobs, len(todo)), ctx.threads) as pool:
        futures = {pool.submit(judge, items[i]): i for i in todo}
        try:
            for future in as_completed(futures):
                keep(futures[future], future.result())
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    return judged


def run_progress(run_dir: Path) -> str:
    """Where a run in flight is: `step N/M` from its metrics and its config (RLVR
    `train.steps`, Zero `train.iterations`, SFT `steps`), or `starting` before its first
    step. A line the run is still writing is skipped, not an error."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        lines = []
    steps = []
    for line in lines:
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int):
            steps.append(step)
    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        cfg = {}
    train = cfg.get("train") or {}
    total = train.get("steps") or train.get("iterations") or cfg.get("steps") or "?"
    return f"step {max(steps)}/{total}" if steps else "starting"


def in_flight_line(ctx: Context, runs: list[tuple[str, int]], done: int, total: int) -> str:
    """One progress line: how many runs are trained, and where each one in flight is: of the
    `runs` not yet trained, those whose folder a live process holds (a pool marks queued
    work as running before a worker takes it, so the lock says, not the future)."""
    where = "; ".join(f"{label} seed {seed}: {run_progress(run_dir)}"
                      for label, seed in runs
                      if run_in_flight(run_dir := arm_run_dir(ctx, label, seed)))
    return f"{done}/{total} runs trained; in flight: {where or 'none'}"


def train_arms_at_once(ctx: Context, arms: list, jobs: int) -> dict[str, list[Any]]:
    """Every arm with every seed, up to `jobs` runs at once; by label (in `arms`' order), in
    seed order, as `train_arms` returns them. The first run that fails stops the others from
    starting (those running finish: their folders are reused by the next command)."""
    check_jobs(jobs)
    if jobs == 1:
        return train_arms(ctx, arms)
    shared_inputs(ctx, arms)
    fleet_arms = [arm for arm in arms if on_fleets(ctx, arm)]
    runs = [(arm, seed) for seed in ctx.seeds for arm in arms if arm not in fleet_arms]
    threads = worker_threads(jobs)
    quiet = replace(ctx, progress=False, threads=threads)
    done: dict[tuple[str, int], Any] = {}
    with _worker_pool(min(jobs, len(runs) or 1), threads) as pool:
        futures: dict[Future, tuple[str, int]] = {
            pool.submit(train_one, quiet, arm, seed): (arm.label, seed) for arm, seed in runs}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=PROGRESS_SECONDS,
                                     return_when=FIRST_COMPLETED)
            if not finished and ctx.progress:
                waiting = [futures[f] for f in pending]
                print(in_flight_line(ctx, waiting, len(done), len(runs)), file=sys.stderr,
                      flush=True)
            for future in finished:
                if future.exception() is not None:
                    for other in pending:
                        other.cancel()
                label, seed = futures[future]
                done[(label, seed)] = future.result()  # a run's error is raised here
                if ctx.progress:
                    print(f"arm {label}, seed {seed}: trained ({len(done)}/{len(runs)})",
                          file=sys.stderr, flush=True)
    for label, runs_ in train_arms(ctx, fleet_arms).items():
        for run in runs_:
            done[(label, run.seed)] = run
    return {arm.label: [done[(arm.label, seed)] for seed in ctx.seeds] for arm in arms}
