"""What every experiment stands on: the reasoning task at a budget (`Scale`), one SFT base
model per experiments folder (built once, reused by every experiment there), and training
runs (`Arm`s) made of the library's own reasoning configs with dotted overrides and run by
the library's own loop. A Zero experiment's runs (`ZeroArm`s) are the library's Zero configs
with overrides, run by the Zero loop; they need no base model.

    OUT/base/             the SFT run (configs/rlvr/reasoning_sft.yaml + the scale's overrides)
    OUT/base/model/       the base model every arm starts from
    OUT/teacher-NAME/     a teacher: the base fine-tuned further (SFT), built once
    OUT/NAME/arms/LABEL_sSEED/   one RLVR, SFT or Zero run directory per arm and seed
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import config_to_dict, load_config
from ..runtime import rundir
from ..runtime.errors import first_line
from ..runtime.metrics import read_metrics
from ..runtime.rundir import RunDirError

if TYPE_CHECKING:
    from ..zero.config import ZeroConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "rlvr"
ZERO_CONFIGS = CONFIGS.parent / "zero"
SFT_CONFIG = "reasoning_sft.yaml"     # under configs/rlvr/
RL_CONFIG = "reasoning.yaml"

# Short chains of one-digit terms with guesses in half the demonstrations: the reasoning
# task at a size a quick run learns in seconds (tests/test_learning.py uses the same).
QUICK_TASK = {"min_terms": 2, "max_terms": 3, "max_digits": 1,
              "strategies": {"guess": 0.5, "plain": 0.25, "careful": 0.25}}


@dataclass(frozen=True)
class Scale:
    """A budget for the whole set-up: the task's options, the base model's SFT and what
    every RL arm shares, as dotted overrides on configs/rlvr/reasoning_sft.yaml and
    configs/rlvr/reasoning.yaml; experiments add their own (steps, the compared setting)."""

    name: str
    task_options: dict[str, Any]
    sft: tuple[str, ...]
    rl: tuple[str, ...]
    seeds: int                  # the default number of seeds
    variant_sft: tuple[str, ...] = ()  # on top of `sft` for an arm's own base (BaseVariant)

    def task_overrides(self) -> list[str]:
        return task_overrides(self.task_options)


def task_overrides(options: dict[str, Any]) -> list[str]:
    return [f"task.options={json.dumps(options)}"] if options else []


QUICK = Scale("quick", QUICK_TASK,
              sft=("data.examples=4000", "steps=150", "batch_size=64", "warmup_steps=20",
                   "compute_dtype=float32"),
              rl=("rollout.prompts_per_step=8", "rollout.group_size=8",
                  "rollout.max_new_tokens=64", "train.lr=3e-4", "train.warmup_steps=2",
                  "eval.every=0", "checkpoint.keep=1"),
              seeds=1,
              # an arm's own base only feeds the quick pipeline check: a third of the steps
              variant_sft=("steps=50",))
# The documented reasoning set-up (docs/reasoning.md) as it is: its SFT base (410 s on 2
# cores) and its GRPO config; experiments set the steps.
FULL = Scale("full", {}, sft=(), rl=("checkpoint.keep=1",), seeds=4)
SCALES = {s.name: s for s in (QUICK, FULL)}


@dataclass(frozen=True)
class Context:
    """Where and at what budget one experiment runs."""

    out: Path                   # the experiment's folder, OUT/NAME
    scale: Scale
    seeds: tuple[int, ...]
    base: Path | None           # the SFT base model every arm starts from (Zero: None)
    overwrite: bool = False     # retrain arms instead of reusing finished ones
    progress: bool = True
    threads: int = 0            # --jobs: a Zero run's thread cap (RLVR runs take the worker's)
    jobs: int = 1               # --jobs: runs trained, and measurements judged, at once


def capped_threads(threads: int, cap: int) -> int:
    """`threads` a Zero config names, at most `cap` where runs share the cores (0: no cap)."""
    return min(threads, cap) if cap else threads


@dataclass(frozen=True)
class BaseVariant:
    """An SFT base of some arms' own: the shared base's SFT with more task options (e.g.
    demonstrations that call the calculator) and SFT overrides (e.g. a pretraining corpus of
    data.documents), built once in OUT/base-NAME."""

    name: str
    task_options: tuple[tuple[str, Any], ...]
    sft_overrides: tuple[str, ...] = ()

    def options(self, scale: Scale) -> dict[str, Any]:
        return {**scale.task_options, **dict(self.task_options)}


@dataclass(frozen=True)
class FineTune:
    """A model made from the base by more SFT (configs/rlvr/reasoning_sft.yaml from
    model.path = the base, with `overrides`), built once in OUT/teacher-NAME and shared by
    every experiment there: e.g. a teacher for on-policy distillation."""

    name: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Arm:
    """One setting an experiment trains, once per seed: a label and its overrides on
    configs/rlvr/reasoning.yaml (beyond the scale's); `base`: an SFT base of its own instead
    of the shared one; `teacher`: a fine-tuned base as `teacher.path` (objective opd)."""

    label: str
    overrides: tuple[str, ...] = ()
    base: BaseVariant | None = None
    teacher: FineTune | None = None


@dataclass(frozen=True)
class SFTArm:
    """One setting an experiment trains by supervised fine-tuning of the base, once per
    seed: a label and its overrides on configs/rlvr/reasoning_sft.yaml (beyond starting
    from the base; `seed` and the paths are set per run)."""

    label: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class ZeroArm:
    """One setting a Zero experiment trains, once per seed: a label, a config under
    configs/zero/ and its overrides (`train.seed` and the run directory are set per run)."""

    label: str
    config: str                 # e.g. "tictactoe.yaml"
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrainedRun:
    """One arm trained with one seed: its run directory, its final model, and the overrides
    that made it without the paths (`recipe`). The kinds below narrow `arm` and add what
    only they know; the field order is the same for all."""

    arm: Arm | SFTArm | ZeroArm
    seed: int
    run_dir: Path
    final: Path                 # the final model folder (RLVR, SFT: HF; Zero: model.json)

    def metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.run_dir)

    def fingerprint(self) -> str:
        """A short digest of the final model's files: a judgement saved for this run is
        reused only while it names the same model (a retrained arm gets another)."""
        digest = hashlib.blake2b(digest_size=6)
        for path in sorted(p for p in self.final.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(self.final)).encode())
            digest.update(path.read_bytes())
        return digest.hexdigest()


@dataclass(frozen=True)
class TrainedArm(TrainedRun):
    arm: Arm
    base: Path                  # the SFT base model it started from
    overrides: tuple[str, ...]  # everything set on configs/rlvr/reasoning.yaml (paths too)
    recipe: tuple[str, ...]     # the same without the paths and the progress bar

    def config(self):
        """The arm's RLVRConfig, as it was trained."""
        from ..rlvr.config import RLVRConfig

        return load_config(RLVRConfig, CONFIGS / RL_CONFIG, list(self.overrides))


@dataclass(frozen=True)
class TrainedSFTArm(TrainedRun):
    arm: SFTArm
    recipe: tuple[str, ...]     # the overrides on reasoning_sft.yaml, without the paths


@dataclass(frozen=True)
class TrainedZeroArm(TrainedRun):
    arm: ZeroArm
    recipe: tuple[str, ...]     # the overrides on the arm's config, without the paths


def arm_run_dir(ctx: Context, label: str, seed: int) -> Path:
    """Where an arm's run with `seed` lives (RLVR and Zero alike)."""
    return ctx.out / "arms" / f"{label}_s{seed}"


def is_finished(ctx: Context, label: str, seed: int) -> bool:
    """Whether the arm's run already finished (a rerun reuses it without training)."""
    return (arm_run_dir(ctx, label, seed) / "final").is_dir()


def zero_recipe(arm: ZeroArm, seed: int) -> tuple[str, ...]:
    """The overrides on `arm`'s Zero config that make its run with `seed`."""
    return (*arm.overrides, f"train.seed={seed}")


def zero_arm_config(ctx: Context, arm: ZeroArm, seed: int) -> ZeroConfig:
    """`arm`'s Zero config with `seed`, its run folder as `out`; with `ctx.threads`, the
    config's `train.threads` capped at it (Zero configs name their threads, and runs trained
    at once would oversubscribe the cores; threads change speed, not the run)."""
    from ..zero.config import ZeroConfig

    where = [*zero_recipe(arm, seed), f"out={arm_run_dir(ctx, arm.label, seed)}"]
    cfg = load_config(ZeroConfig, ZERO_CONFIGS / arm.config, where)
    threads = capped_threads(cfg.train.threads, ctx.threads)
    if threads != cfg.train.threads:
        cfg = load_config(ZeroConfig, ZERO_CONFIGS / arm.config,
                          [*where, f"train.threads={threads}"])
    return cfg


def train_zero_arm(ctx: Context, arm: ZeroArm, seed: int) -> TrainedZeroArm:
    """Train `arm` with `seed` through the Zero loop (`zero.loop.train`); a finished run with
    the same config is reused, a killed one continues, one with another config is refused."""
    from ..zero.loop import train

    run_dir = arm_run_dir(ctx, arm.label, seed)
    try:
        result = train(zero_arm_config(ctx, arm, seed), resume=not ctx.overwrite,
                       overwrite=ctx.overwrite, progress=ctx.progress)
    except RunDirError as exc:
        raise _not_reusable(run_dir, exc) from None
    return TrainedZeroArm(arm, seed, run_dir, result.final_dir, zero_recipe(arm, seed))


# Fields that change logging or speed only: a base built with other values is the same base.
BASE_FREE_FIELDS = ("progress", "tensorboard", "threads", "logging.*", "run_dir", "out")


def base_model(root: Path, scale: Scale, *, variant: BaseVariant | None = None,
               progress: bool = True) -> Path:
    """The SFT base model of `root` (an experiments folder) at `scale`, or its `variant`:
    built on first use with the library's `sft`, reused afterwards (every experiment in
    `root` starts from it); a base built with another config is an error, not a silent
    mismatch."""
    if variant is None:
        run_dir, options, own = root / "base", scale.task_options, ()
    else:
        run_dir, options = root / f"base-{variant.name}", variant.options(scale)
        own = (*scale.variant_sft, *variant.sft_overrides)
    cfg = _sft_config([*scale.sft, *task_overrides(options), *own], run_dir, run_dir / "model",
                      progress)
    return _sft_once(cfg, run_dir, "base model")


def fine_tuned(root: Path, base: Path, scale: Scale, fine_tune: FineTune, *,
               progress: bool = True) -> Path:
    """`fine_tune` of the `base` model, built in root/teacher-NAME on first use and reused
    afterwards (a model built with another config is refused, as for the base)."""
    run_dir = root / f"teacher-{fine_tune.name}"
    cfg = _sft_config([*_from_base(base, scale), *fine_tune.overrides], run_dir,
                      run_dir / "model", progress)
    return _sft_once(cfg, run_dir, "fine-tuned model")


def _from_base(base: Path, scale: Scale) -> list[str]:
    """reasoning_sft.yaml's overrides for fine-tuning `base` on the scale's task."""
    return ["init_preset=null", f"model.path={base}", *scale.task_overrides()]


def _sft_config(overrides: list[str], run_dir: Path, out: Path, progress: bool):
    """configs/rlvr/reasoning_sft.yaml with `overrides`, run in `run_dir`, the model to `out`."""
    from ..rlvr.config import SFTConfig

    return load_config(SFTConfig, CONFIGS / SFT_CONFIG,
                       [*overrides, f"out={out}", f"run_dir={run_dir}",
                        f"progress={str(progress).lower()}"])


def _sft_once(cfg, run_dir: Path, what: str, *, overwrite: bool = False) -> Path:
    """The model `cfg` makes, trained unless run_dir already holds it with the same config
    (a different config is an error; what a killed run left is replaced)."""
    from ..rlvr.distill import sft

    model = Path(cfg.out)
    if (model / "config.json").is_file() and not overwrite:
        recorded = rundir.with_defaults(type(cfg), rundir.read_recorded_config(run_dir) or {})
        changes = [c for c in rundir.config_changes(recorded, config_to_dict(cfg),
                                                     BASE_FREE_FIELDS) if not c.free]
        if changes:
            raise RunDirError(f"the {what} in {run_dir} was built with another config "
                              f"({rundir.describe(changes)}); delete {run_dir} or pass another --out")
        return model
    return sft(cfg, overwrite=True)  # no model yet: what a killed build left is replaced


def train_sft_arm(ctx: Context, arm: SFTArm, seed: int) -> TrainedSFTArm:
    """Fine-tune the base with `arm`'s SFT settings and `seed` (the library's `sft`); a
    finished run with the same config is reused, one with another config is refused."""
    run_dir = arm_run_dir(ctx, arm.label, seed)
    recipe = (*arm.overrides, f"seed={seed}", f"data.seed={seed}")
    cfg = _sft_config([*_from_base(ctx.base, ctx.scale), *recipe], run_dir, run_dir / "final",
                      ctx.progress)
    try:
        final = _sft_once(cfg, run_dir, f"arm {arm.label}", overwrite=ctx.overwrite)
    except RunDirError as exc:
        raise _not_reusable(run_dir, exc) from None
    return TrainedSFTArm(arm, seed, run_dir, final, recipe)


def recipe(scale: Scale, arm: Arm, seed: int) -> tuple[str, ...]:
    """What an arm sets on configs/rlvr/reasoning.yaml, besides its paths."""
    return (*scale.task_overrides(), *scale.rl, *arm.overrides, f"train.seed={seed}")


def arm_config(ctx: Context, arm: Arm, seed: int):
    """The RLVRConfig `arm` trains with at `seed` (its paths left at the config's): for
    experiments that measure the library's pieces on the base model without a training run."""
    from ..rlvr.config import RLVRConfig

    return load_config(RLVRConfig, CONFIGS / RL_CONFIG,
                       [f"model.path={ctx.base}", *recipe(ctx.scale, arm, seed)])


def arm_inputs(ctx: Context, arm: Arm) -> tuple[Path, Path | None]:
    """The base `arm` starts from and its teacher (None without one), built on first use."""
    base = ctx.base if arm.base is None else base_model(ctx.out.parent, ctx.scale,
                                                        variant=arm.base, progress=ctx.progress)
    teacher = None if arm.teacher is None else fine_tuned(ctx.out.parent, base, ctx.scale,
                                                          arm.teacher, progress=ctx.progress)
    return base, teacher


def train_arm(ctx: Context, arm: Arm, seed: int, *,
              fleets: contextlib.ExitStack | None = None) -> TrainedArm:
    """Train `arm` with `seed` through the library's loop (`rlvr.loop.train`). A finished
    run with the same config is reused (the loop's resume finds nothing to do), a killed one
    continues from its last checkpoint, one with another config is refused. `fleets`: where
    a fleets run's Ray session is kept open for the arms after it."""
    from ..rlvr.config import RLVRConfig
    from ..rlvr.loop import fleet_session, train

    run_dir = arm_run_dir(ctx, arm.label, seed)
    base, teacher_path = arm_inputs(ctx, arm)
    teacher = () if teacher_path is None else (f"teacher.path={teacher_path}",)
    overrides = (f"model.path={base}", f"run_dir={run_dir}", *teacher,
                 *recipe(ctx.scale, arm, seed), f"progress={str(ctx.progress).lower()}")
    cfg = load_config(RLVRConfig, CONFIGS / RL_CONFIG, list(overrides))
    if not cfg.checkpoint.every:
        raise ValueError(f"arm {arm.label}: checkpoint.every must be > 0 so that a finished "
                         "arm can be reused")
    if fleets is not None and cfg.runtime.mode != "sync":
        fleets.enter_context(fleet_session(cfg))  # joins the session once one is open
    try:
        final = train(cfg, resume=not ctx.overwrite, overwrite=ctx.overwrite)
    except RunDirError as exc:  # the loop's words are about `rlvr train`'s flags
        raise _not_reusable(run_dir, exc) from None
    return TrainedArm(arm, seed, run_dir, final, base, overrides, recipe(ctx.scale, arm, seed))


def _not_reusable(run_dir: Path, exc: RunDirError) -> RunDirError:
    """A loop's refusal, in the experiments' own flags."""
    return RunDirError(f"the arm in {run_dir} cannot be reused ({first_line(exc)}); pass "
                       "--overwrite to retrain the arms, or another --out")


def train_one(ctx: Context, arm: Arm | SFTArm | ZeroArm, seed: int, *,
              fleets: contextlib.ExitStack | None = None) -> Any:
    """One arm with one seed: an RLVR, SFT or Zero run."""
    if isinstance(arm, ZeroArm):
        return train_zero_arm(ctx, arm, seed)
    if isinstance(arm, SFTArm):
        return train_sft_arm(ctx, arm, seed)
    return train_arm(ctx, arm, seed, fleets=fleets)


def train_arms(ctx: Context, arms: list[Arm | SFTArm] | list[ZeroArm]) -> dict[str, list[Any]]:
    """Every arm with every seed, one after another; by label, in seed order. Arms on the
    fleets share one Ray session, opened by the first of them (~6 s a run saved here)."""
    trained: dict[str, list[Any]] = {}
    with contextlib.ExitStack() as fleets:
        for seed in ctx.seeds:
            for arm in arms:
                trained.setdefault(arm.label, []).append(train_one(ctx, arm, seed,
                                                                   fleets=fleets))
    return trained


def shared_inputs(ctx: Context, arms: list) -> None:
    """Build what several arms read (their own SFT bases, fine-tuned teachers) now, so that
    arms trained at once never build one twice."""
    for arm in arms:
        if isinstance(arm, Arm):
            arm_inputs(ctx, arm)


def on_fleets(ctx: Context, arm: Any) -> bool:
    """Whether `arm` trains on the asynchronous fleets (its own worker processes)."""
    return isinstance(arm, Arm) and arm_config(ctx, arm, 0).runtime.mode != "sync"


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of a metric over a run, where it was logged as a number."""
    kept = [r for r in rows if isinstance(r.get(key), int | float)]
    return [r["step"] for r in kept], [float(r[key]) for r in kept]


def mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    """A metric's mean over every step where it was logged."""
    _, values = series(rows, key)
    return sum(values) / len(values) if values else None


def windowed(rows: list[dict[str, Any]], key: str, steps: int,
             width: int) -> tuple[list[float], list[float]]:
    """A metric's mean over consecutive windows of `width` steps (1..steps): (window centres,
    means). A window where it was never logged repeats the previous mean (the first, the
    next one logged), so every run of `steps` steps gives a curve of the same points; a
    metric never logged gives zeros."""
    logged = dict(zip(*series(rows, key), strict=True))
    centres, means = [], []
    for lo in range(1, steps + 1, width):
        chosen = [logged[s] for s in range(lo, min(lo + width, steps + 1)) if s in logged]
        centres.append(lo + (min(width, steps + 1 - lo) - 1) / 2)
        means.append(sum(chosen) / len(chosen) if chosen else None)
    known = [m for m in means if m is not None]
    if not known:
        return centres, [0.0] * len(centres)
    filled, last = [], known[0]
    for m in means:
        last = last if m is None else m
        filled.append(last)
    return centres, filled


def windowed_curves(runs: list[Any], keys: tuple[str, ...], steps: int,
                    width: int) -> tuple[list[float], dict[str, list[list[float]]]]:
    """Each metric of `keys` as `windowed` curves, one per run (in seed order), and the
    window centres they share."""
    centres: list[float] = []
    curves: dict[str, list[list[float]]] = {key: [] for key in keys}
    for run in runs:
        rows = run.metrics()
        for key in keys:
            centres, values = windowed(rows, key, steps, width)
            curves[key].append(values)
    return centres, curves
