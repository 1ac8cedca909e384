"""rlscale against Hugging Face TRL's `GRPOTrainer`: wall time per GRPO step, side by side.

    make bench                                   # TRL into .venv once, then the full table
    .venv/bin/python benchmarks/vs_trl.py        # the same table into runs/vs_trl/
    .venv/bin/python benchmarks/vs_trl.py --models tiny --tokens 16 --steps 2 --warmup 1 \
        --repeats 1                              # a smoke run (about a minute)
    .venv/bin/python benchmarks/vs_trl.py --models reasoning=runs/reasoning/base \
        --task long_arithmetic --tokens 256      # a trained model from a local folder

`--models` takes presets and NAME=PATH for a model saved in a local Hugging Face folder (the
reasoning quickstart's SFT base, say), which both sides load as it is; `--task` picks the
task whose train prompts and verifier both sides use (default arithmetic).

One workload on both sides: the arithmetic task's train prompts (the very prompts rlscale's
loop draws at each step), 8 prompts x 8 completions per step, temperature 1, one AdamW
update per batch (lr 1e-4, no minibatches, no second pass), no KL term, on the CPU with
`--threads` torch threads, at each `--precision`: fp32 (both sides in fp32: like for like) and
bf16 (both autocast to bf16 with fp32 weights: each side's default on a CPU with native bf16,
rlscale's `train.compute_dtype: auto` and GRPOConfig's `bf16=True`). Models: the presets tiny (0.8 M), small (6.3 M) and medium
(31.5 M), freshly initialised (`init_model`, seed 0) and saved once as a Hugging Face folder
that both sides load. A random-init model rarely samples EOS (about one token in a hundred
with the character vocabulary), and a batch stops early only when all 64 rows have ended, so
each side's batch runs for the full `--tokens` budget every step; a row, though, ends at its
own EOS (at 256 tokens rows average 80-90), and the table shows each side's mean completion
length so the equal work is visible. The lower bound counts every row for the full budget,
so at long budgets a step can come in under it.

rlscale runs its real loop (`rlscale.rlvr.loop.train` on configs/rlvr/quickstart.yaml with
the workload's overrides, everything else at its defaults, so its update packs several
sequences per row (`train.pack`) where TRL pads each); a step's time is `time/step_s`
from the run's metrics.jsonl (collect, advantages, update). TRL runs `GRPOTrainer` with
`steps_per_generation=1`, `num_iterations=1`, `gradient_accumulation_steps=1` and 64
completions per device batch, so each optimiser step generates its own batch and skips the
old-log-prob forward, as rlscale does; `gradient_checkpointing=False` (GRPOConfig's default
is True, rlscale's False: recomputation would be extra work on one side only) and
`loss_type="grpo"`, `scale_rewards="none"` (rlscale's grpo preset: per-sequence token mean,
no std division). A TRL step is timed from `on_step_begin` to `on_step_end` of a
TrainerCallback: generation and scoring run inside `training_step` (`_prepare_inputs`),
within that window, which every run checks (the reward call's time must fall inside a
window). The table's times are step-end to step-end intervals (rlscale: when each step's
metrics are logged; TRL: `on_step_end`), so everything either loop does per step counts,
rlscale's non-finite-guard snapshot and logging included; `step_median_s` in results.json
is the timed step alone (rlscale's `time/step_s`, TRL's callback window).

Every run is its own process (`--worker`), one at a time; repeats interleave the two sides,
alternating which goes first. The first `--warmup` steps of each run are dropped; min and
median are over all remaining steps of all repeats. Prints a markdown table, writes
`<out>/results.json`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "rlvr" / "quickstart.yaml"
PROMPTS, GROUP = 8, 8          # prompts per step, completions per prompt
LR, TEMPERATURE, SEED = 1e-4, 1.0, 0
NOT_INSTALLED = "error: TRL is not installed: pip install -e '.[bench]'"
# fp32: both sides compute in fp32 (like for like). bf16: both autocast to bf16 with fp32
# weights (rlscale train.compute_dtype=bfloat16, TRL bf16=True): each side's default on a CPU
# with native bf16 (rlscale's `auto`; GRPOConfig's bf16 defaults to True).
COMPUTE_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}


def step_prompts(task, steps: int, seed: int = SEED) -> list[list]:
    """The examples rlscale's loop draws at each step (rollout draw 0), in order."""
    from rlscale.rlvr.rollout.groups import step_seed

    return [[task.sample("train", random.Random(step_seed(seed, step, "prompts:0")))
             for _ in range(PROMPTS)] for step in range(steps)]


def measured(values: list[float], warmup: int) -> list[float]:
    return values[warmup:]


def intervals(stamps: list[float], warmup: int) -> list[float]:
    """Step-end to step-end times of the measured steps (the first step has no predecessor)."""
    return [b - a for i, (a, b) in enumerate(zip(stamps, stamps[1:], strict=False))
            if i + 1 >= warmup]


# -- the two workers (each in its own process) ---------------------------------------------
def run_rlscale(model_path: str, run_dir: str, tokens: int, steps: int, warmup: int,
                threads: int, precision: str, task_name: str) -> dict:
    import torch

    from rlscale.config import load_config
    from rlscale.rlvr.config import RLVRConfig
    from rlscale.rlvr.loop import train
    from rlscale.runtime.metrics import MetricsLogger, read_metrics

    torch.set_num_threads(threads)
    overrides = [
        f"model.path={model_path}", f"run_dir={run_dir}", f"task.name={task_name}",
        "objective=grpo", "loss.kl_coef=0.0",
        f"rollout.prompts_per_step={PROMPTS}", f"rollout.group_size={GROUP}",
        f"rollout.max_new_tokens={tokens}", f"rollout.temperature={TEMPERATURE}",
        f"train.steps={warmup + steps}", f"train.lr={LR}", f"train.threads={threads}",
        f"train.seed={SEED}", "eval.every=0", "checkpoint.every=0", "progress=false",
        "device=cpu",  # TRL runs with use_cpu=True: the CPU here too
        f"train.compute_dtype={COMPUTE_DTYPE[precision]}"]
    cfg = load_config(RLVRConfig, CONFIG, overrides)
    # When each step's metrics are written: the whole loop iteration, guard and logging included.
    logged: list[float] = []
    log = MetricsLogger.log

    def timed_log(self, step, metrics):
        logged.append(time.perf_counter())
        return log(self, step, metrics)

    MetricsLogger.log = timed_log
    train(cfg, overwrite=True)
    rows = read_metrics(run_dir)
    return {"step_s": measured([r["time/step_s"] for r in rows], warmup),
            "collect_s": measured([r["time/collect_s"] for r in rows], warmup),
            "train_s": measured([r["time/train_s"] for r in rows], warmup),
            "update_s": measured([r["time/update_s"] for r in rows], warmup),
            "length": measured([r["length/mean"] for r in rows], warmup),
            "post_update_stats_steps": sum("policy/kl_new_old" in r for r in rows[warmup:]),
            "iteration_s": intervals(logged, warmup), "steps": len(rows)}


def run_trl(model_path: str, run_dir: str, tokens: int, steps: int, warmup: int,
            threads: int, precision: str, task_name: str) -> dict:
    import warnings

    import torch
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")  # TRL's and accelerate's advice for GPU training
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlscale.rlvr.model import load_tokenizer
    from rlscale.rlvr.tasks import make_task

    disable_progress_bar()
    torch.set_num_threads(threads)
    task = make_task(task_name)
    per_step = step_prompts(task, warmup + steps)
    by_prompt = {ex.prompt: ex for batch in per_step for ex in batch}
    dataset = Dataset.from_dict({"prompt": [ex.prompt for batch in per_step for ex in batch]})
    scored: list[tuple[float, list[int]]] = []  # (when a batch was scored, completion lengths)

    def verifier(prompts, completions, completion_ids, **_):
        rewards = []
        for prompt, completion in zip(prompts, completions, strict=True):
            try:
                rewards.append(float(task.verify(completion, by_prompt[prompt])))
            except Exception:  # rlscale scores a verifier error 0 as well
                rewards.append(0.0)
        scored.append((time.perf_counter(), [len(ids) for ids in completion_ids]))
        return rewards

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.end.append(time.perf_counter())

    config = GRPOConfig(
        output_dir=run_dir, per_device_train_batch_size=PROMPTS * GROUP,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        num_generations=GROUP, max_completion_length=tokens, temperature=TEMPERATURE,
        top_p=1.0, top_k=0, beta=0.0, loss_type="grpo", scale_rewards="none",
        learning_rate=LR, weight_decay=0.0, max_grad_norm=1.0, gradient_checkpointing=False,
        bf16=precision == "bf16", fp16=False, use_cpu=True, report_to="none", logging_steps=1,
        save_strategy="no", max_steps=warmup + steps, seed=SEED, dataloader_num_workers=0,
        disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                 local_files_only=True)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=verifier, args=config,
                          train_dataset=dataset, processing_class=load_tokenizer(model_path),
                          callbacks=[timer])
    trainer.remove_callback(PrinterCallback)  # this process's stdout is one JSON line
    trainer.train()
    windows = list(zip(timer.begin, timer.end, strict=True))
    if len(scored) != len(windows):
        raise RuntimeError(f"TRL scored {len(scored)} batches in {len(windows)} steps")
    # Generation precedes scoring in the same `_prepare_inputs` call: a scoring time inside
    # its step's window puts that step's generation inside it too.
    inside = all(b <= t <= e for (b, e), (t, _) in zip(windows, scored, strict=True))
    return {"step_s": measured([e - b for b, e in windows], warmup),
            "collect_s": measured([t - b for (b, _), (t, _) in zip(windows, scored, strict=True)],
                                  warmup),
            "train_s": measured([e - t for (_, e), (t, _) in zip(windows, scored, strict=True)],
                                warmup),
            "length": measured([statistics.mean(n) for _, n in scored], warmup),
            "generation_in_window": inside, "iteration_s": intervals(timer.end, warmup),
            "steps": len(windows)}


WORKERS = {"rlscale": run_rlscale, "trl": run_trl}


# -- the machine's limits ------------------------------------------------------------------
def machine_rates(threads: int) -> dict[str, float]:
    """Measured here: matmul FLOP/s in fp32 and bf16 (2048^3, best of 5) and memory bandwidth
    (a 512 MiB copy: bytes read + written per second, best of 5)."""
    import torch

    torch.set_num_threads(threads)
    rates = {}
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x, y = a.to(dtype), b.to(dtype)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            x @ y
            best = min(best, time.perf_counter() - t0)
            if best > 5.0:  # no native bf16 (e.g. an AVX2-only CPU): one slow sample is enough
                break
        rates[f"{name}_flops"] = 2 * 2048 ** 3 / best
    src = torch.empty(2 ** 27)  # 512 MiB of fp32
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    rates["bandwidth"] = 2 * src.numel() * 4 / best
    return rates


def prompt_tokens(task_name: str) -> float:
    """Mean prompt length in tokens of the workload (the character tokenizer)."""
    from rlscale.rlvr.model import PromptFormatter, build_char_tokenizer
    from rlscale.rlvr.tasks import make_task

    tokenizer = build_char_tokenizer()
    formatter = PromptFormatter(tokenizer, False, None)
    examples = [ex for batch in step_prompts(make_task(task_name), 8) for ex in batch]
    return statistics.mean(len(tokenizer(formatter(ex), add_special_tokens=False)["input_ids"])
                           for ex in examples)


def cpu_flags() -> str:
    """The CPU's matmul-relevant flags (which decide whether bf16 is native), for the record."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    found = [f for f in wanted if f in line.split()]
    return " ".join(found) or "none of " + ", ".join(wanted)


def lower_bound(params: float, prompt: float, tokens: int, rates: dict, precision: str,
                mean_length: float | None = None) -> float:
    """Seconds a step cannot go below here: each of `tokens` decode steps reads the fp32
    weights once (at the measured bandwidth) or does its 2 N FLOPs per row (at matmul peak),
    whichever is slower; the update does 3 forwards' FLOPs, 6 N per token of every row, at
    matmul peak.

    Without `mean_length` every row counts for the full budget. With it (the rows' mean
    completion length as sampled), the bound at those lengths: the batch still runs `tokens`
    decode steps (its longest row), each reading the weights, but only the rows still going
    do FLOPs, and the update trains on the tokens sampled; a step cannot beat this one
    either, and at long budgets, where rows end early, it is the one that measures distance."""
    peak = rates[f"{precision}_flops"]
    rows = PROMPTS * GROUP
    length = tokens if mean_length is None else mean_length
    decode = max(tokens * 4 * params / rates["bandwidth"], 2 * params * rows * length / peak)
    update = 6 * params * rows * (prompt + length) / peak
    return decode + update


# -- the driver ----------------------------------------------------------------------------
def run_child(system: str, model_path: Path, run_dir: Path, tokens: int, precision: str,
              args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", system,
           "--model-path", str(model_path), "--run-dir", str(run_dir), "--tokens", str(tokens),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
           "--precision", precision, "--task", args.task]
    threads = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        sys.exit(f"error: the {system} run in {run_dir} failed (exit {proc.returncode}):\n"
                 f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def summary(runs: list[dict]) -> dict:
    """Min and median of the step-end to step-end interval (everything a loop does per step:
    rlscale's non-finite-guard snapshot and logging included), and of the timed step."""
    steps = [s for run in runs for s in run["iteration_s"]]
    timed = [s for run in runs for s in run["step_s"]]
    out = {"min_s": min(steps), "median_s": statistics.median(steps),
           "step_median_s": statistics.median(timed),
           "collect_median_s": statistics.median(s for run in runs for s in run["collect_s"]),
           "train_median_s": statistics.median(s for run in runs for s in run["train_s"]),
           "mean_length": statistics.mean(x for run in runs for x in run["length"])}
    updates = [s for run in runs for s in run.get("update_s", [])]
    out["update_median_s"] = statistics.median(updates) if updates else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small,medium",
                        help="presets, and NAME=PATH for a model in a local folder")
    parser.add_argument("--task", default="arithmetic",
                        help="the task whose prompts and verifier both sides use")
    parser.add_argument("--tokens", default="16,128,256",
                        help="completion tokens, comma-separated")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at each run's start")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="fp32,bf16",
                        help="fp32 and/or bf16 (autocast, fp32 weights), comma-separated")
    parser.add_argument("--out", default="runs/vs_trl")
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = WORKERS[args.worker](args.model_path, args.run_dir, int(args.tokens), args.steps,
                                      args.warmup, args.threads, args.precision, args.task)
        print(json.dumps(result))
        return
    if importlib.util.find_spec("trl") is None:
        sys.exit(NOT_INSTALLED)

    from transformers.utils import logging as hf_logging

    from rlscale.rlvr.model import count_parameters, init_model, load_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out = Path(args.out)
    specs = dict(spec.split("=", 1) if "=" in spec else (spec, "")
                 for spec in args.models.split(","))
    models, token_counts = list(specs), [int(t) for t in args.tokens.split(",")]
    for name, folder in specs.items():
        if folder and not (Path(folder) / "config.json").is_file():
            sys.exit(f"error: --models {name}={folder}: no Hugging Face model folder there")
    versions = {name: version(name) for name in ("torch", "transformers", "trl")}
    print(f"torch {versions['torch']}, transformers {versions['transformers']}, "
          f"trl {versions['trl']}; {args.threads} thread(s); CPU flags: {cpu_flags()}")
    print(f"workload: {args.task}, {PROMPTS} prompts x {GROUP} completions per step, "
          f"temperature {TEMPERATURE}, AdamW lr {LR}, CPU; random-init presets (EOS is rare: "
          f"every batch runs the full budget, its rows end at their EOS) and local models as "
          f"saved; {args.warmup} warmup + {args.steps} measured steps per run, {args.repeats} "
          f"interleaved repeat(s)")
    rates = machine_rates(args.threads)
    prompt = prompt_tokens(args.task)
    print(f"machine: fp32 matmul {rates['fp32_flops'] / 1e9:.0f} GFLOP/s, bf16 matmul "
          f"{rates['bf16_flops'] / 1e9:.0f} GFLOP/s, memory bandwidth "
          f"{rates['bandwidth'] / 1e9:.1f} GB/s; prompts {prompt:.1f} tokens on average")
    paths, params = {}, {}
    for name, folder in specs.items():
        paths[name] = (Path(folder).resolve() if folder else
                       init_model(name, out / "models" / name, seed=SEED, overwrite=True).resolve())
        params[name] = count_parameters(load_model(paths[name])[0]) / 1e6
    precisions = args.precision.split(",")
    cells = [(p, name, tokens) for p in precisions for name in models for tokens in token_counts]
    runs: dict[tuple[str, str, int], dict[str, list[dict]]] = {
        cell: {"rlscale": [], "trl": []} for cell in cells}
    for repeat in range(args.repeats):
        order = ("rlscale", "trl") if repeat % 2 == 0 else ("trl", "rlscale")
        for precision, name, tokens in cells:
            for system in order:
                run_dir = (out / "runs" / f"{precision}_{name}_{tokens}" /
                           f"{system}_{repeat}").resolve()
                t0 = time.perf_counter()
                result = run_child(system, paths[name], run_dir, tokens, precision, args)
                runs[precision, name, tokens][system].append(result)
                print(f"  repeat {repeat}: {precision} {name} {tokens} tokens, {system}: median "
                      f"step {statistics.median(result['step_s']):.3f} s "
                      f"({time.perf_counter() - t0:.0f} s with start-up)", file=sys.stderr)
    print("\n| precision | model | completion tokens | rlscale min / median s | TRL min / median s | "
          "TRL / rlscale | rlscale collect / train s | TRL generate+score / rest s | "
          "mean length rlscale / TRL | lower bound s | rlscale / bound | TRL / bound | "
          "at the sampled lengths: bound rlscale / TRL s | rlscale / its bound | TRL / its bound |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
          "---: | ---: | ---: |")
    cell_results = []
    for precision, name, tokens in cells:
        ours, theirs = (summary(runs[precision, name, tokens][s]) for s in ("rlscale", "trl"))
        ratio = theirs["median_s"] / ours["median_s"]
        bound = lower_bound(params[name] * 1e6, prompt, tokens, rates, precision)
        sampled = {side: lower_bound(params[name] * 1e6, prompt, tokens, rates, precision,
                                     result["mean_length"])
                   for side, result in (("rlscale", ours), ("trl", theirs))}
        # The update's useful FLOP rate: 6 N per completion token, over the update's time.
        useful = (6 * params[name] * 1e6 * PROMPTS * GROUP * ours["mean_length"]
                  / ours["update_median_s"])
        print(f"| {precision} | {name} ({params[name]:.1f} M) | {tokens} | {ours['min_s']:.3f} / "
              f"{ours['median_s']:.3f} | {theirs['min_s']:.3f} / {theirs['median_s']:.3f} | "
              f"{ratio:.2f}x | {ours['collect_median_s']:.3f} / {ours['train_median_s']:.3f} | "
              f"{theirs['collect_median_s']:.3f} / {theirs['train_median_s']:.3f} | "
              f"{ours['mean_length']:.1f} / {theirs['mean_length']:.1f} | {bound:.3f} | "
              f"{ours['median_s'] / bound:.2f}x | {theirs['median_s'] / bound:.2f}x | "
              f"{sampled['rlscale']:.3f} / {sampled['trl']:.3f} | "
              f"{ours['median_s'] / sampled['rlscale']:.2f}x | "
              f"{theirs['median_s'] / sampled['trl']:.2f}x |")
        cell_results.append({"precision": precision, "model": name, "params_m": params[name],
                             "tokens": tokens, "rlscale": ours, "trl": theirs,
                             "trl_over_rlscale": ratio, "lower_bound_s": bound,
                             "lower_bound_at_sampled_lengths_s": sampled,
                             "update_useful_flops": useful,
                             "update_useful_share_of_fp32_peak": useful / rates["fp32_flops"],
                             "runs": runs[precision, name, tokens]})
    outside = [f"{c['precision']} {c['model']}/{c['tokens']}" for c in cell_results
               if not all(r["generation_in_window"] for r in c["runs"]["trl"])]
    if outside:
        print(f"warning: TRL scored a batch outside its step window in {', '.join(outside)}")
    print("\nTRL / rlscale > 1: rlscale is faster (ratio of the median step-end to step-end times).")
    print("\nrlscale's update, useful FLOP rate (6 x parameters x completion tokens / update "
          "time) against the measured fp32 matmul peak:")
    for c in cell_results:
        print(f"  {c['precision']} {c['model']} {c['tokens']}: "
              f"{c['update_useful_flops'] / 1e9:.0f} GFLOP/s = "
              f"{100 * c['update_useful_share_of_fp32_peak']:.0f}% of fp32 peak")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({
        "versions": versions, "threads": args.threads, "steps": args.steps,
        "warmup": args.warmup, "repeats": args.repeats, "prompts_per_step": PROMPTS,
        "group_size": GROUP, "lr": LR, "temperature": TEMPERATURE, "task": args.task,
        "models": {name: str(paths[name]) for name in models}, "machine": rates,
        "prompt_tokens": prompt, "cells": cell_results},
        indent=1))
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
