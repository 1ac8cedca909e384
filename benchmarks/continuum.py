"""The SFT-RL continuum, measured: six ways to improve one student on one task, at one budget.

    python benchmarks/continuum.py                    # into runs/continuum/ (~40 min on 2 cores)
    python benchmarks/continuum.py --steps 4 --every 2 --student-steps 50 --teacher-steps 4 \
        --out runs/continuum_smoke                    # a smoke run of the whole pipeline

Task: arithmetic, post-trained on `--task-options` (default `add_digits=2 mul_share=0`: sums
of 1-2 digit numbers). In distribution (ID): that task's held-out hash split `test`; out of
distribution (OOD): its `ood` split, one digit more than post-training ever shows
(tasks/arithmetic.py): sums with a 3-digit operand. The student's own SFT saw such sums (with
wrong answers mixed in), so OOD asks whether post-training on the narrow distribution carries
over beyond it or overwrites it (the setting of Chu et al. 2025, "SFT Memorizes, RL
Generalizes"). `--task-options add_digits=3 mul_share=0.3` is the quickstart distribution,
whose ood split (4-digit operands) no model here ever saw.

Student: the quickstart base (configs/rlvr/quickstart_sft.yaml: SFT on demonstrations of
which 40% are wrong or sloppy). Teacher: the quickstart's GRPO run from that student
(configs/rlvr/quickstart.yaml, 150 steps), clearly stronger.

Methods, each from the student for `--steps` steps of 256 trained sequences (RL: 32 prompts
x 8 samples; SFT: batches of 256), AdamW at lr 1e-4 after 10 warmup steps:

    sft            SFT on the task's (clean) demonstrations
    dft            DFT on the same demonstrations (loss: dft)
    sft_teacher    SFT on teacher samples (data.source: teacher), one per prompt
    grpo           GRPO on the verifier's reward only
    opd            on-policy distillation (objective: opd)
    opd_verifier   OPD plus the verifier's advantage (loss.reward_weight: 1)

Every `--every` steps the model is measured on 500 ID and 500 OOD prompts x 2 samples
(temperature 1). Compute is counted three ways: tokens generated (by the student or the
teacher), tokens trained on (forward + backward), and an estimate of FLOPs: 2 N per token
of a forward (prompt and completion positions), 6 N per trained token, with N each model's
parameter count. Prints the tables, writes `<out>/results.json` and one plot per split
(pass@1 against FLOPs); docs/continuum.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

from rlscale.config import load_config
from rlscale.experiments.continuum import compute_curve as compute_curve_of
from rlscale.rlvr.config import RLVRConfig, SFTConfig
from rlscale.rlvr.distill import sft
from rlscale.rlvr.evaluate import evaluate
from rlscale.rlvr.loop import train
from rlscale.rlvr.model import count_parameters, load_model
from rlscale.rlvr.tasks import make_task
from rlscale.runtime import checkpoint as ckpt
from rlscale.runtime.metrics import read_metrics

CONFIGS = Path("configs/rlvr")
SEQUENCES = 256        # trained sequences per step, every method
EVAL_PROMPTS, EVAL_SAMPLES, MAX_NEW = 500, 2, 8
SFT_ARMS = {"sft": ["loss=sft"], "dft": ["loss=dft"],
            "sft_teacher": ["loss=sft", "data.source=teacher", f"data.max_new_tokens={MAX_NEW}"]}
RL_ARMS = {"grpo": ["objective=grpo"], "opd": ["objective=opd"],
           "opd_verifier": ["objective=opd", "loss.reward_weight=1.0"]}
METHODS = [*SFT_ARMS, *RL_ARMS]
SPLITS = ("test", "ood")


def task_overrides(options: list[str]) -> list[str]:
    return [f"task.options.{o}" for o in options]


def measure(path: Path, task) -> dict[str, float]:
    model, tokenizer = load_model(path)
    out = {}
    for split in SPLITS:
        r = evaluate(model, tokenizer, task, split=split, seed=0, prompts=EVAL_PROMPTS,
                     samples=EVAL_SAMPLES, ks=(1,), max_new_tokens=MAX_NEW, temperature=1.0)
        out[split] = r.pass_at[1]
        out[f"{split}_length"] = r.mean_length
    return out


def prompt_tokens(task, tokenizer, n: int = 2000) -> float:
    """Mean prompt length in tokens over `n` training prompts."""
    rng = random.Random(0)
    return sum(len(tokenizer(task.sample("train", rng).prompt, add_special_tokens=False)["input_ids"])
               for _ in range(n)) / n


def build_student_and_teacher(out: Path, student_steps: int | None,
                              teacher_steps: int | None) -> tuple[Path, Path]:
    """The quickstart base and its GRPO run (each reused when already in `out`); the step
    counts default to the quickstart configs'."""
    student, teacher_run = out / "student", out / "teacher"
    if not (student / "config.json").is_file():
        sft(load_config(SFTConfig, CONFIGS / "quickstart_sft.yaml",
                        [f"out={student}", f"run_dir={out / 'student_sft'}", "progress=false",
                         *([f"steps={student_steps}"] if student_steps else [])]))
    teacher = teacher_run / "final"
    if not (teacher / "config.json").is_file():
        train(load_config(RLVRConfig, CONFIGS / "quickstart.yaml",
                          [f"model.path={student}", f"run_dir={teacher_run}", "progress=false",
                           *([f"train.steps={teacher_steps}"] if teacher_steps else [])]))
    return student, teacher


def run_sft_arm(name: str, student: Path, teacher: Path, out: Path, steps: int,
                every: int, options: list[str]) -> dict[int, Path]:
    args = [f"model.path={student}", f"out={out / name / 'model'}", f"run_dir={out / name}",
            f"data.examples={steps * SEQUENCES}", f"steps={steps}", f"batch_size={SEQUENCES}",
            "lr=1e-4", "warmup_steps=10", f"save_every={every}", "progress=false",
            "task.name=arithmetic", *task_overrides(options), *SFT_ARMS[name]]
    if name == "sft_teacher":
        args.append(f"teacher.path={teacher}")
    final = sft(load_config(SFTConfig, None, args))
    found = {ckpt.checkpoint_step(p): p for p in ckpt.list_checkpoints(out / name)}
    return {**found, steps: final}


def run_rl_arm(name: str, student: Path, teacher: Path, out: Path, steps: int,
               every: int, options: list[str]) -> dict[int, Path]:
    args = [f"model.path={student}", f"run_dir={out / name}", f"train.steps={steps}",
            f"checkpoint.every={every}", "checkpoint.keep=1000", "eval.every=0",
            "train.post_update_stats=false", "progress=false", *task_overrides(options),
            *RL_ARMS[name]]
    if name != "grpo":
        args.append(f"teacher.path={teacher}")
    final = train(load_config(RLVRConfig, CONFIGS / "quickstart.yaml", args))
    found = {ckpt.checkpoint_step(p): p for p in ckpt.list_checkpoints(out / name)}
    return {**found, steps: final}


def compute_curve(name: str, run_dir: Path, n_student: int, n_teacher: int,
                  prompt_len: float) -> dict[int, dict[str, float]]:
    """Cumulative (generated tokens, trained tokens, FLOPs) after each step, from the run's
    metrics (the reasoning continuum's own count, experiments/continuum.py); sft_teacher's
    teacher wrote its whole pool first, charged up front."""
    rows = [r for r in read_metrics(run_dir) if "step" in r]
    curve = compute_curve_of(rows, supervised=name in SFT_ARMS,
                             teacher_scores=name in RL_ARMS and name != "grpo",
                             params=n_student, teacher_params=n_teacher,
                             prompt_tokens=prompt_len, sequences=SEQUENCES)
    upfront = {"generated": 0.0, "trained": 0.0, "flops": 0.0}
    if name == "sft_teacher":
        mean_target = sum(r["sft/target_tokens"] for r in rows) / (len(rows) * SEQUENCES)
        pool = len(rows) * SEQUENCES
        upfront = {"generated": pool * mean_target, "trained": 0.0,
                   "flops": 2 * n_teacher * pool * (prompt_len + mean_target)}
    return {step: {k: v + upfront[k] for k, v in vars(c).items()} for step, c in curve.items()}


def reach_compute(points: list[dict], target: float) -> float | None:
    """FLOPs at the first measured point whose ID pass@1 reaches `target`."""
    for p in points:
        if p["test"] >= target:
            return p["flops"]
    return None


def standard_error(p: float, n: int = EVAL_PROMPTS * EVAL_SAMPLES) -> float:
    return math.sqrt(max(p * (1 - p), 1e-9) / n)


def report(results: dict, out: Path) -> None:
    student, teacher = results["student"], results["teacher"]
    print(f"\nstudent: ID {student['test']:.3f}, OOD {student['ood']:.3f}; teacher: ID "
          f"{teacher['test']:.3f}, OOD {teacher['ood']:.3f}")
    print("\n| method | ID pass@1 | OOD pass@1 | ID gain | OOD gain | generated tokens | "
          "trained tokens | FLOPs (est.) | wall |\n|" + " --- |" * 9)
    for name in METHODS:
        if name not in results["methods"]:
            continue
        m = results["methods"][name]
        end = m["points"][-1]
        print(f"| {name} | {end['test']:.3f} | {end['ood']:.3f} | "
              f"{100 * (end['test'] - student['test']):+.1f} | "
              f"{100 * (end['ood'] - student['ood']):+.1f} | {end['generated']:.2e} | "
              f"{end['trained']:.2e} | {end['flops']:.2e} | {m['wall_s']:.0f} s |")
    print("\npass@1 along the way (ID / OOD at each measured step):")
    for name, m in results["methods"].items():
        print(f"  {name:13s} " + "  ".join(f"{p['step']}: {p['test']:.3f}/{p['ood']:.3f}"
                                            for p in m["points"]))
    target = student["test"] + 0.9 * (teacher["test"] - student["test"])
    print(f"\ncompute to reach 90% of the teacher's ID gain (pass@1 >= {target:.3f}):")
    for name, m in results["methods"].items():
        flops = reach_compute(m["points"], target)
        print(f"  {name:13s} {'not reached' if flops is None else f'{flops:.2e} FLOPs'}")
    plot(results, out)


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for split, label in (("test", "in distribution (test)"), ("ood", "out of distribution (ood)")):
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for name, m in results["methods"].items():
            points = [p for p in m["points"] if p["flops"] > 0]
            ax.plot([p["flops"] for p in points], [p[split] for p in points], marker="o", label=name)
        ax.axhline(results["teacher"][split], color="k", ls="--", lw=1, label="teacher")
        ax.axhline(results["student"][split], color="gray", ls=":", lw=1, label="student")
        ax.set_xscale("log")
        ax.set_xlabel("estimated FLOPs (student training + sampling + teacher)")
        ax.set_ylabel("pass@1")
        ax.set_title(f"arithmetic {results['task_options']}, {label}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"continuum_{split}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/continuum"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--only", choices=METHODS, action="append")
    parser.add_argument("--student-steps", type=int, help="default: quickstart_sft.yaml's")
    parser.add_argument("--teacher-steps", type=int, help="default: quickstart.yaml's")
    parser.add_argument("--task-options", nargs="*", default=["add_digits=2", "mul_share=0.0"],
                        help="the post-training task's options, key=value")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"methods": {}}
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.task_options)}
    task = make_task("arithmetic", **options)
    student, teacher = build_student_and_teacher(out, args.student_steps, args.teacher_steps)
    student_model, tokenizer = load_model(student)
    n_student = count_parameters(student_model)
    n_teacher = count_parameters(load_model(teacher)[0])
    prompt_len = prompt_tokens(task, tokenizer)
    results.update(student=measure(student, task), teacher=measure(teacher, task),
                   parameters={"student": n_student, "teacher": n_teacher},
                   prompt_tokens=prompt_len, steps=args.steps, sequences_per_step=SEQUENCES,
                   task_options=options)
    for name in args.only or METHODS:
        t0 = time.perf_counter()
        run = run_sft_arm if name in SFT_ARMS else run_rl_arm
        saved = run(name, student, teacher, out, args.steps, args.every, args.task_options)
        wall = time.perf_counter() - t0
        curve = compute_curve(name, out / name, n_student, n_teacher, prompt_len)
        points = [{"step": 0, **curve[0], **{s: results["student"][s] for s in SPLITS}}]
        for step in sorted(saved):
            points.append({"step": step, **curve[step], **measure(saved[step], task)})
        results["methods"][name] = {"wall_s": wall, "points": points}
        results_path.write_text(json.dumps(results, indent=1))
        print(f"{name}: done in {wall:.0f} s; ID {points[-1]['test']:.3f}, OOD {points[-1]['ood']:.3f}")
    report(results, out)
    print(f"results: {results_path}")


if __name__ == "__main__":
    main()
