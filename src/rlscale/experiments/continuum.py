"""The SFT-RL continuum on the reasoning task: four ways to improve one student, from the
same SFT base, at the same number of steps and trained sequences per step.

    sft    SFT on an expert's traces (the task's `careful` demonstrator: every step checked
           and redone until its check passes, so every trace ends right)
    dft    DFT (Wu et al. 2025) on the same traces
    opd    on-policy distillation (objective opd) from a teacher: the base fine-tuned
           further on the same expert's traces, built once (setup.FineTune)
    grpo   GRPO on the verifier's one bit at the end of each trace, no expert at all

Each arm is measured along the way (every `every` steps) on held-out `test` and on the
rule-change `ood` split (every prompt has a term with the digit 7, which no train or test
prompt has: tasks/long_arithmetic.py), against three counts of compute from its own
metrics: tokens generated, tokens trained on, and FLOPs (2N per sampled or scored position,
6N per trained one; N the parameter count, the teacher's for OPD's scoring). The claims:
RL carries its gain out of distribution where SFT on expert traces memorises (Chu et al.
2025), and on-policy distillation's per-token signal beats GRPO's sparse reward at equal
steps (Agarwal et al. 2024; Lu & Thinking Machines 2025), above all on the longest traces.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import load_config
from ..rlvr.config import RLVRConfig
from ..rlvr.model import count_parameters, load_model
from ..runtime import checkpoint as ckpt
from .measure import by_level, held_out, run_task
from .plots import plt, save_figure, tidy
from .record import Analysis, Table
from .setup import (
    CONFIGS,
    RL_CONFIG,
    SCALES,
    Arm,
    Context,
    FineTune,
    SFTArm,
    arm_config,
    fine_tuned,
)
from .spec import Experiment, Numbers
from .stats import cell, curve, mean, paired
from .verdict import Effect

NAME = "continuum"
CLAIM = ("From one SFT student, GRPO carries more of its gain to the rule-change ood split "
         "than SFT on an expert's traces does (SFT memorises, RL generalises), and on-policy "
         "distillation from an expert teacher beats GRPO's one bit per trace at equal steps.")
SPLITS = ("test", "ood")
EXPERT = 'task.options.strategies={"careful": 1.0}'   # every step checked: traces end right
METHODS = ("sft", "dft", "opd", "grpo")


@dataclass(frozen=True)
class Settings:
    steps: int            # every arm's optimizer steps
    every: int            # measured every this many steps (and at 0 and the end)
    prompts: int          # held-out prompts per split and measurement
    samples: int          # per prompt
    teacher_steps: int    # the teacher's SFT on the expert's traces, batches of 64
    teacher_lr: float
    traces: int           # the SFT arms' fixed set of expert traces, seen for several epochs


SETUP = ("From the SFT base: SFT and DFT on a fixed set of 1,024 of the careful "
         "demonstrator's traces (every step checked, every trace right), 6 epochs of it, so "
         "SFT can memorise; on-policy distillation (objective opd) from a teacher "
         "(the base fine-tuned on 400 batches of those traces), and GRPO on the verifier "
         "alone, each 48 steps of 128 sequences with GRPO's learning rate; pass@1 on test, "
         "on its longest chains and on the rule-change ood split, every 16 steps, against "
         "tokens generated, positions trained and FLOPs.")
SETTINGS = {"quick": Settings(steps=4, every=2, prompts=16, samples=2, teacher_steps=8,
                              teacher_lr=1e-3, traces=64),
            "full": Settings(steps=48, every=16, prompts=400, samples=2, teacher_steps=400,
                             teacher_lr=1e-3, traces=1024)}


def teacher(scale: str) -> FineTune:
    s = SETTINGS[scale]
    return FineTune("careful", (EXPERT, f"steps={s.teacher_steps}", "batch_size=64",
                                f"data.examples={64 * s.teacher_steps}", f"lr={s.teacher_lr:g}",
                                "warmup_steps=20", "save_every=0"))


def rl_config(scale: str) -> RLVRConfig:
    """The RL arms' config at `scale` (paths left at the config's): the SFT arms copy its
    batch, learning rate and warmup."""
    sc = SCALES[scale]
    return load_config(RLVRConfig, CONFIGS / RL_CONFIG, [*sc.task_overrides(), *sc.rl])


def arms(scale: str) -> list[Arm | SFTArm]:
    s, cfg = SETTINGS[scale], rl_config(scale)
    sequences = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    sft = (EXPERT, f"steps={s.steps}", f"batch_size={sequences}",
           f"data.examples={s.traces}", f"lr={cfg.train.lr:g}",
           f"warmup_steps={cfg.train.warmup_steps}", f"save_every={s.every}")
    rl = (f"train.steps={s.steps}", f"checkpoint.every={s.every}", "checkpoint.keep=1000",
          "eval.every=0")
    return [SFTArm("sft", (*sft, "loss=sft")), SFTArm("dft", (*sft, "loss=dft")),
            Arm("opd", (*rl, "objective=opd"), teacher=teacher(scale)),
            Arm("grpo", (*rl, "objective=grpo"))]


# -- compute ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Compute:
    """Cumulative compute after a step."""

    generated: float      # tokens sampled (by the student)
    trained: float        # positions forward + backward (prompt and completion)
    flops: float          # estimated


def compute_curve(rows: list[dict[str, Any]], *, supervised: bool, teacher_scores: bool,
                  params: int, teacher_params: int, prompt_tokens: float,
                  sequences: int) -> dict[int, Compute]:
    """{step: compute so far} of one run from its metrics rows (0: nothing yet).
    `supervised` (SFT/DFT): 6N per trained position (`sft/prompt_tokens` +
    `sft/target_tokens`), nothing generated. Otherwise (RL): each of `sequences` completions
    per step (`length/mean`) is sampled (2N per position, prompt included) and trained on
    (6N); `teacher_scores` (OPD): the teacher scores each position (2N of the teacher)."""
    generated = trained = flops = 0.0
    out = {0: Compute(0.0, 0.0, 0.0)}
    for r in rows:
        if "step" not in r:
            continue
        if supervised:
            if "sft/target_tokens" not in r:
                continue
            positions = r["sft/prompt_tokens"] + r["sft/target_tokens"]
            trained += positions
            flops += 6 * params * positions
        else:
            if "length/mean" not in r:
                continue
            completion = r["length/mean"] * sequences
            positions = prompt_tokens * sequences + completion
            generated += completion
            trained += positions
            flops += 8 * params * positions
            if teacher_scores:
                flops += 2 * teacher_params * positions
        out[int(r["step"])] = Compute(generated, trained, flops)
    return out


def mean_prompt_tokens(task, tokenizer, n: int = 500) -> float:
    rng = random.Random(0)
    return sum(len(tokenizer(task.sample("train", rng).prompt, add_special_tokens=False)
                   ["input_ids"]) for _ in range(n)) / n


# -- measuring ----------------------------------------------------------------------------

def figures(path: Path, cfg: RLVRConfig, seed: int, s: Settings) -> dict[str, float]:
    """pass@1 on test and ood, and on test's longest chains (`hard`)."""
    out: dict[str, float] = {}
    for split in SPLITS:
        r = held_out(path, cfg, seed=seed, budget=s, split=split)
        out[split] = r.pass_at[1]
        if split == "test":
            levels = by_level(r.details, "accuracy")
            out["hard"] = levels[max(levels, key=int)] if levels else r.pass_at[1]
    return out


def saved_models(run) -> dict[int, Path]:
    """{step: model folder} of a run's checkpoints and its final model."""
    found = {ckpt.checkpoint_step(p): p for p in ckpt.list_checkpoints(run.run_dir)}
    last = max((int(r["step"]) for r in run.metrics() if "step" in r), default=0)
    return {**found, last: run.final}


def measure(ctx: Context, trained: dict[str, list[Any]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    cfg0 = arm_config(ctx, Arm("measure"), ctx.seeds[0])
    student, tokenizer = load_model(ctx.base)
    params = count_parameters(student)
    teacher_path = fine_tuned(ctx.out.parent, ctx.base, ctx.scale, teacher(ctx.scale.name),
                              progress=ctx.progress)
    teacher_params = count_parameters(load_model(teacher_path)[0])
    prompt_tokens = mean_prompt_tokens(run_task(cfg0), tokenizer)
    sequences = cfg0.rollout.prompts_per_step * cfg0.rollout.group_size
    out: dict[str, Any] = {"student": [], "teacher": []}
    for seed in ctx.seeds:
        cfg = arm_config(ctx, Arm("measure"), seed)
        out["student"].append(figures(ctx.base, cfg, seed, s))
        out["teacher"].append(figures(teacher_path, cfg, seed, s))
    arms_out: dict[str, list[list[dict]]] = {}
    for label, runs in trained.items():
        arms_out[label] = []
        for run, start in zip(runs, out["student"], strict=True):
            cfg = arm_config(ctx, Arm("measure"), run.seed)
            spent = compute_curve(run.metrics(), supervised=isinstance(run.arm, SFTArm),
                                  teacher_scores=getattr(run.arm, "teacher", None) is not None,
                                  params=params, teacher_params=teacher_params,
                                  prompt_tokens=prompt_tokens, sequences=sequences)
            points = [{"step": 0, **vars(spent[0]), **start}]
            for step, path in sorted(saved_models(run).items()):
                points.append({"step": step, **vars(spent[step]),
                               **figures(path, cfg, run.seed, s)})
            arms_out[label].append(points)
    return {"seeds": list(ctx.seeds), "steps": s.steps, "every": s.every,
            "prompts": s.prompts, "samples": s.samples, "sequences": sequences,
            "parameters": {"student": params, "teacher": teacher_params},
            "prompt_tokens": prompt_tokens, "teacher_steps": s.teacher_steps,
            "arms": arms_out, **out}


# -- analysis -----------------------------------------------------------------------------

def final(numbers: Numbers, label: str, key: str) -> list[float]:
    return [points[-1][key] for points in numbers["arms"][label]]


def gain(numbers: Numbers, label: str, key: str) -> list[float]:
    """The arm's final figure minus the student's, per seed."""
    return [b - a[key] for a, b in zip(numbers["student"], final(numbers, label, key),
                                       strict=True)]


def first_reaching(points_per_seed: list[list[dict]], key: str, target: float) -> float | None:
    """The mean FLOPs at the first measured step whose mean `key` reaches `target`."""
    steps = len(points_per_seed[0])
    for i in range(steps):
        if mean([p[i][key] for p in points_per_seed]) >= target:
            return mean([p[i]["flops"] for p in points_per_seed])
    return None


def analyse(numbers: Numbers) -> Analysis:
    effects = [
        Effect("ood gain: GRPO - SFT", paired(gain(numbers, "sft", "ood"),
                                              gain(numbers, "grpo", "ood")),
               expected_sign=+1, min_effect=0.02),
        Effect("test pass@1: OPD - GRPO", paired(final(numbers, "grpo", "test"),
                                                  final(numbers, "opd", "test")),
               expected_sign=+1, min_effect=0.02),
        Effect("test pass@1 on the longest chains: OPD - GRPO",
               paired(final(numbers, "grpo", "hard"), final(numbers, "opd", "hard")),
               expected_sign=+1, primary=False, min_effect=0.02),
        Effect("ood gain: OPD - SFT (on- vs off-policy imitation of the expert)",
               paired(gain(numbers, "sft", "ood"), gain(numbers, "opd", "ood")),
               expected_sign=+1, primary=False, min_effect=0.02),
        Effect("ood gain: DFT - SFT", paired(gain(numbers, "sft", "ood"),
                                             gain(numbers, "dft", "ood")),
               expected_sign=+1, primary=False, min_effect=0.02),
        Effect("ood share of the test gain: GRPO - SFT",
               paired(transfer(numbers, "sft"), transfer(numbers, "grpo")),
               expected_sign=+1, primary=False, min_effect=0.05),
    ]
    rows = [[name, "0", cell([f["test"] for f in numbers[name]]),
             cell([f["ood"] for f in numbers[name]]), cell([f["hard"] for f in numbers[name]]),
             "", "", "", "", ""] for name in ("student", "teacher")]
    rows[1][1] = f"{numbers['teacher_steps']} (SFT, batch 64)"
    for label in METHODS:
        if label not in numbers["arms"]:
            continue
        end = [p[-1] for p in numbers["arms"][label]]
        rows.append([label, str(numbers["steps"]), cell(final(numbers, label, "test")),
                     cell(final(numbers, label, "ood")), cell(final(numbers, label, "hard")),
                     cell(gain(numbers, label, "test")), cell(gain(numbers, label, "ood")),
                     f"{mean([e['generated'] for e in end]):.3g}",
                     f"{mean([e['trained'] for e in end]):.3g}",
                     f"{mean([e['flops'] for e in end]):.3g}"])
    table = Table(["model", "steps", "test pass@1", "ood pass@1", "longest chains",
                   "test gain", "ood gain", "tokens generated", "positions trained",
                   "FLOPs (est.)"], rows)
    student_test = mean([f["test"] for f in numbers["student"]])
    teacher_test = mean([f["test"] for f in numbers["teacher"]])
    notes = [f"{numbers['prompts']} held-out prompts x {numbers['samples']} samples per split "
             f"and measurement; every arm {numbers['steps']} steps of {numbers['sequences']} "
             "sequences (RL: prompts x group; SFT/DFT: the batch), measured every "
             f"{numbers['every']} steps. FLOPs: 2N per sampled or teacher-scored position, 6N "
             f"per trained one (N = {numbers['parameters']['student']:,} for student and "
             "teacher); the teacher's own SFT is not charged to OPD."]
    target = student_test + 0.5 * (teacher_test - student_test)
    if teacher_test > student_test:
        reach = []
        for label in METHODS:
            if label in numbers["arms"]:
                flops = first_reaching(numbers["arms"][label], "test", target)
                reach.append(f"{label} {'not reached' if flops is None else f'{flops:.2g}'}")
        notes.append(f"FLOPs to reach half the teacher's test gain (pass@1 >= {target:.3f}): "
                     + ", ".join(reach) + ".")
        closed = [f"{label} {mean(gain(numbers, label, 'test')) / (teacher_test - student_test):.0%}"
                  for label in METHODS if label in numbers["arms"]]
        notes.append(f"The teacher is {teacher_test - student_test:+.3f} above the student on "
                     "test, so OPD had something to distil; the share of that gap each arm "
                     f"closed in {numbers['steps']} steps: " + ", ".join(closed) + ".")
    else:
        notes.append(f"The teacher ({teacher_test:.3f}) was no better than the student "
                     f"({student_test:.3f}) on test: OPD had nothing to distil.")
    return Analysis(effects, table, notes)


def transfer(numbers: Numbers, label: str) -> list[float]:
    """ood gain over test gain per seed (0 where the test gain is not positive)."""
    return [o / t if t > 0 else 0.0 for o, t in zip(gain(numbers, label, "ood"),
                                                     gain(numbers, label, "test"), strict=True)]


def plot(numbers: Numbers, out: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for ax, split in zip(axes, SPLITS, strict=True):
        for label in METHODS:
            if label not in numbers["arms"]:
                continue
            per_seed = numbers["arms"][label]
            flops, _ = curve([[max(p["flops"], 1.0) for p in seed] for seed in per_seed])
            values, se = curve([[p[split] for p in seed] for seed in per_seed])
            ax.errorbar(flops[1:], values[1:], yerr=se[1:], marker="o", capsize=3, label=label)
        for name, style in (("teacher", "--"), ("student", ":")):
            ax.axhline(mean([f[split] for f in numbers[name]]), color="k" if name == "teacher"
                       else "grey", linestyle=style, linewidth=1, label=name)
        ax.set_xscale("log")
        ax.set_xlabel("estimated FLOPs (training + sampling + teacher scoring)")
        ax.set_ylabel("pass@1")
        ax.set_title("in distribution (test)" if split == "test"
                     else "rule change (ood: a term with the digit 7)")
        tidy(ax)
    return save_figure(fig, out)


# minutes: teacher ~4 min; per seed SFT+DFT ~3, OPD ~5, GRPO ~4; measuring ~6 (43.7
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=17.5)
