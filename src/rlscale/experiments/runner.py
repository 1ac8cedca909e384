"""`rlscale experiments run NAME`: the base model, the arms, the measurements, the analysis,
the figure and the saved result, in that order.

    OUT/NAME/arms/          the RLVR runs (reused on a rerun when finished)
    OUT/NAME/measurements.json
    OUT/NAME/figure.png
    OUT/NAME/result.json    the typed record (record.ExperimentResult)
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

from ..runtime.device import machine_summary
from ..runtime.rundir import read_recorded_config
from .parallel import check_jobs, train_arms_at_once, worker_threads
from .record import (
    FIGURE_NAME,
    MEASUREMENTS_NAME,
    ArmRecord,
    ExperimentResult,
    save_result,
)
from .registry import EXPERIMENTS
from .setup import SCALES, Arm, Context, base_model, is_finished
from .spec import Experiment

DEFAULT_OUT = {"full": Path("runs/experiments"), "quick": Path("runs/experiments-quick")}


def get(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment '{name[:40]}' (known: {', '.join(EXPERIMENTS)})")
    return EXPERIMENTS[name]


def command(name: str, *, quick: bool, seeds: int, out: Path, base: Path | None) -> str:
    """The command that reproduces a run, with relative paths only (paths outside the
    working folder are left out: the defaults stand in for them)."""
    scale = "quick" if quick else "full"
    parts = ["rlscale", "experiments", "run", name]
    if quick:
        parts.append("--quick")
    if seeds != SCALES[scale].seeds:
        parts += ["--seeds", str(seeds)]
    for flag, path, default in (("--out", out, DEFAULT_OUT[scale]), ("--base", base, None)):
        if path is None:
            continue
        relative = os.path.relpath(Path(path).resolve(), Path.cwd())
        if not relative.startswith("..") and Path(relative) != default:
            parts += [flag, relative]
    return " ".join(parts)


def arms_compute_dtype(trained: dict) -> str:
    """The dtype(s) the arms computed in, as their config.yaml records it (`auto` resolved)."""
    dtypes = set()
    for runs in trained.values():
        for run in runs:
            recorded = read_recorded_config(run.run_dir) or {}
            dtype = recorded.get("train", {}).get("compute_dtype")  # RLVR's, resolved
            if dtype is None:  # Zero's: `auto` in its config, the choice in its metrics
                chosen = [r["precision/bfloat16"] for r in run.metrics()
                          if "precision/bfloat16" in r]
                dtype = ("bfloat16" if chosen[-1] else "float32") if chosen \
                    else recorded.get("compute_dtype")
            dtypes.add(str(dtype or "unknown"))
    return ", ".join(sorted(dtypes))


def uses_shared_base(experiment: Experiment, arms: list) -> bool:
    """Whether an experiment needs OUT/base: an RLVR one does unless every arm trains from a
    base of its own (a `BaseVariant`), e.g. checking's two bases; one without arms measures
    the base itself (baseline_variance)."""
    own_bases = all(isinstance(arm, Arm) and arm.base is not None for arm in arms)
    return experiment.needs_base and (not arms or not own_bases)


def run_experiment(name: str, *, quick: bool = False, seeds: int | None = None,
                   out: Path | None = None, base: Path | None = None, overwrite: bool = False,
                   progress: bool = True, jobs: int = 1) -> ExperimentResult:
    """Run experiment `name` in `out/name` (out: runs/experiments, or runs/experiments-quick
    with `quick`) and save its result there. `base`: an existing SFT base model of the same
    task (e.g. runs/reasoning/base) instead of the one built in `out/base`; `jobs`: runs
    trained (and measurements judged) at once, each in a process of its own
    (experiments.parallel)."""
    experiment = get(name)
    scale = SCALES["quick" if quick else "full"]
    n_seeds = scale.seeds if seeds is None else seeds
    if n_seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {n_seeds}")
    check_jobs(jobs)  # before the base is built
    root = Path(out) if out is not None else DEFAULT_OUT[scale.name]
    if base is not None and not (Path(base) / "config.json").is_file():
        raise ValueError(f"--base {base} is not a model folder (no config.json)")
    start = time.perf_counter()
    arms = experiment.arms(scale.name)
    if not uses_shared_base(experiment, arms):
        base_path = None
    else:
        base_path = Path(base) if base is not None else base_model(root, scale, progress=progress)
    ctx = Context(out=root / name, scale=scale, seeds=tuple(range(n_seeds)), base=base_path,
                  overwrite=overwrite, progress=progress, jobs=jobs,
                  threads=worker_threads(jobs) if jobs > 1 else 0)
    ctx.out.mkdir(parents=True, exist_ok=True)
    reused = 0 if overwrite else sum(is_finished(ctx, arm.label, seed)
                                     for seed in ctx.seeds for arm in arms)
    trained = train_arms_at_once(ctx, arms, jobs)
    numbers = experiment.measure(ctx, trained)
    (ctx.out / MEASUREMENTS_NAME).write_text(json.dumps(numbers, indent=1) + "\n")
    analysis = experiment.analyse(numbers)
    experiment.plot(numbers, ctx.out / FIGURE_NAME)
    result = ExperimentResult(
        name=name, claim=experiment.claim, setup=experiment.setup, budget=scale.name,
        seeds=list(ctx.seeds),
        command=command(name, quick=quick, seeds=n_seeds, out=root, base=base),
        arms=[ArmRecord(run.arm.label, run.seed, list(run.recipe),
                        str(run.run_dir.relative_to(ctx.out)))
              for runs in trained.values() for run in runs],
        analysis=analysis, figure=FIGURE_NAME, seconds=time.perf_counter() - start,
        date=datetime.date.today().isoformat(), machine=machine_summary(),
        compute_dtype=arms_compute_dtype(trained), reused_runs=reused)
    save_result(result, ctx.out)
    return result
