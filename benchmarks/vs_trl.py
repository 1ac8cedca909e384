"""rlscale against Hugging Face TRL's `GRPOTrainer`: wall time per GRPO step, side by side.

    make bench                                   # TRL into .venv once, then the full table
    .venv/bin/python benchmarks/vs_trl.py        # the same table into runs/vs_trl/
    .venv/bin/python benchmarks/vs_trl.py --models tiny --tokens 16 --steps 2 --warmup 1 \
        --repeats 1                              # a smoke run (about a minute)
    .venv/bin/python benchmarks/vs_trl.py --models reasoning=runs/reasoning/base \
        --task long_arithmetic --tokens 256      # a trained model from a local folder
    make smollm                                  # SmolLM2-135M-Instruct into runs/smollm/base
    .venv/bin/python benchmarks/vs_trl.py --models smollm2=runs/smollm/base \
        --config configs/rlvr/smollm.yaml --tokens 128,256 --tuning full,lora \
        --out runs/vs_trl_smollm                 # the SmolLM2 rows, full fine-tuning and LoRA

`--models` takes presets and NAME=PATH for a model saved in a local Hugging Face folder (the
reasoning quickstart's SFT base, say), which both sides load as it is; `--task` picks the
task whose train prompts and verifier both sides use (default arithmetic). `--config` takes
a `rlscale rlvr train` config instead and uses its workload on both sides: its task (name and
options), the way its prompts are rendered (`model.chat_template`, `model.system_prompt`),
its `train.lr`, and on rlscale's side its `train.micro_batch_tokens` (a memory limit that
leaves the gradient as it is; smollm.yaml's 2,048 keeps the 30-layer model's update within
a laptop's memory, where TRL holds the whole batch's activations); nothing else of it
(rollout, steps, ...) changes. With
configs/rlvr/smollm.yaml that is SmolLM2's row: its arithmetic task (one-digit sums asked in
words, the last number of the free-text answer scored), rendered through the model's ChatML
template as a user turn. rlscale renders a prompt with its PromptFormatter; TRL gets a
conversational dataset (`prompt` = the same messages) and applies the same tokenizer's chat
template itself, and every TRL batch's prompt token ids are checked against rlscale's for
the same examples (`prompt_ids_match` in results.json; a warning when they differ). TRL hands
the verifier conversational completions as messages: it scores their text. rlscale stops a
row at the tokenizer's EOS (SmolLM2: `<|im_end|>`); TRL at every id in the model folder's
generation_config.json (SmolLM2: `<|im_end|>` and `<|endoftext|>`, imported by rlscale so);
results.json records which id each TRL row ended at, and both sides' truncated share.

`--tuning full,lora` (default full): LoRA rows train adapters on both sides with the same
peft settings, rlscale's `model.lora` defaults (rank 8, alpha 16, no dropout, every linear
layer but the output layer: `LORA`), rlscale through `model.lora`, TRL through
`peft_config=peft.LoraConfig(...)`, at 10x the full fine-tuning lr on both sides
(`LORA_LR_SCALE`). Each (precision, tuning, model, completion tokens) is a row of the table
and a cell of results.json.

One workload on both sides: the task's train prompts (the very prompts rlscale's loop draws
at each step; TRL reads them in that order, `shuffle_dataset=False`, so its batch k is
rlscale's step k: both sides record them and results.json's `same_prompts` says they were
the same), 8 prompts x 8 completions per step, temperature 1, one AdamW update per
batch (lr 1e-4 with `--task`, the config's `train.lr` with `--config` (smollm.yaml: 5e-6),
x10 for LoRA; no minibatches, no second pass), no KL term, on the CPU with `--threads` torch
threads, at each `--precision`: fp32 (both sides in fp32: like for like) and bf16 (both
autocast to bf16 with fp32 weights: each side's default on a CPU with native bf16,
rlscale's `train.compute_dtype: auto` and GRPOConfig's `bf16=True`). Models: the presets
tiny (0.8 M), small (6.3 M) and medium (31.5 M), freshly initialised (`init_model`, seed 0)
and saved once as a Hugging Face folder that both sides load, and local folders. A
random-init model rarely samples EOS (about one token in a hundred with the character
vocabulary), and a batch stops early only when all 64 rows have ended, so each side's batch
runs for the full `--tokens` budget every step; a row, though, ends at its own EOS (at 256
tokens rows average 80-90), and the table shows each side's mean completion length so the
equal work is visible. The lower bound counts every row for the full budget, so at long
budgets a step can come in under it.

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
import dataclasses
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "rlvr" / "quickstart.yaml"
PROMPTS, GROUP = 8, 8          # prompts per step, completions per prompt
LR, TEMPERATURE, SEED = 1e-4, 1.0, 0  # LR: with --task; --config brings its train.lr
NOT_INSTALLED = "error: TRL is not installed: pip install -e '.[bench]'"
# fp32: both sides compute in fp32 (like for like). bf16: both autocast to bf16 with fp32
# weights (rlscale train.compute_dtype=bfloat16, TRL bf16=True): each side's default on a CPU
# with native bf16 (rlscale's `auto`; GRPOConfig's bf16 defaults to True).
COMPUTE_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}
# LoRA on both sides: rlscale's model.lora defaults (LoraSettings), at 10x the lr.
LORA = {"r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear"}
LORA_LR_SCALE = 10.0
TUNINGS = ("full", "lora")
# The update's FLOPs per token and parameter: forward 2, backward 4 (input and weight
# gradients); LoRA's frozen weights need no weight gradient (the adapters' FLOPs are noise).
UPDATE_FLOPS = {"full": 6, "lora": 4}


@dataclasses.dataclass
class Job:
    """One side's run of one cell, handed to its worker process as JSON."""

    model_path: str
    run_dir: str
    tokens: int
    steps: int
    warmup: int
    threads: int
    precision: str
    tuning: str
    workload: dict


def load_workload(config: str | None, task: str | None) -> dict:
    """What both sides run besides the batch shape: the task (name, options), how a prompt
    is rendered (chat template, system prompt) and the full fine-tuning lr: `--config`'s,
    else `--task` (default arithmetic) on plain prompts at LR."""
    if config is None:
        return {"config": None, "task": task or "arithmetic", "options": {},
                "chat_template": False, "system_prompt": None, "lr": LR, "micro_batch_tokens": 0}
    from rlscale.config import ConfigError, load_config
    from rlscale.rlvr.config import RLVRConfig

    try:
        cfg = load_config(RLVRConfig, config)
    except ConfigError as exc:
        sys.exit(f"error: --config: {exc}")
    if cfg.task.reward is not None or cfg.task.rewards:
        sys.exit(f"error: --config {config}: task.reward(s) is set; both sides score with the "
                 "task's own verifier here")
    return {"config": str(config), "task": cfg.task.name, "options": cfg.task.options,
            "chat_template": cfg.model.chat_template, "system_prompt": cfg.model.system_prompt,
            "lr": cfg.train.lr, "micro_batch_tokens": cfg.train.micro_batch_tokens}


def learning_rate(workload: dict, tuning: str) -> float:
    return workload["lr"] * (LORA_LR_SCALE if tuning == "lora" else 1.0)


def make_workload_task(workload: dict):
    from rlscale.rlvr.tasks import make_task

    return make_task(workload["task"], **workload["options"])


def formatter(tokenizer, workload: dict):
    """rlscale's rendering of a prompt (its PromptFormatter, as the loop builds it)."""
    from rlscale.rlvr.model import PromptFormatter

    return PromptFormatter(tokenizer, workload["chat_template"], workload["system_prompt"])


def trl_prompt(example, workload: dict, fmt):
    """The prompt TRL's dataset holds for `example`: with a chat template the messages
    rlscale's PromptFormatter renders (TRL applies the template itself), else its text."""
    return fmt.messages(example) if workload["chat_template"] else fmt(example)


def prompt_key(prompt) -> str:
    """A TRL prompt (text or messages) as a dictionary key."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def completion_text(completion) -> str:
    """A TRL completion's text: conversational ones come as [{"role": "assistant", ...}]."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def step_prompts(task, steps: int, seed: int = SEED) -> list[list]:
    """The examples rlscale's loop draws at each step (rollout draw 0: one generator per
    step, seeded as `InProcessRollouts.draw` seeds it), in order."""
    from rlscale.rlvr.rollout.groups import step_seed

    def draw(rng: random.Random) -> list:
        return [task.sample("train", rng) for _ in range(PROMPTS)]

    return [draw(random.Random(step_seed(seed, step, "prompts:0"))) for step in range(steps)]


def measured(values: list[float], warmup: int) -> list[float]:
    return values[warmup:]


def intervals(stamps: list[float], warmup: int) -> list[float]:
    """Step-end to step-end times of the measured steps (the first step has no predecessor)."""
    return [b - a for i, (a, b) in enumerate(zip(stamps, stamps[1:], strict=False))
            if i + 1 >= warmup]


# -- the two workers (each in its own process) ---------------------------------------------
def rlscale_config(job: Job):
    """configs/rlvr/quickstart.yaml with the workload: its task, prompt rendering, shape,
    lr, precision and tuning; everything else at its defaults."""
    from rlscale.config import apply_overrides, build_config, read_yaml
    from rlscale.rlvr.config import RLVRConfig

    w = job.workload
    overrides = [
        f"model.path={job.model_path}", f"run_dir={job.run_dir}",
        "objective=grpo", "loss.kl_coef=0.0",
        f"rollout.prompts_per_step={PROMPTS}", f"rollout.group_size={GROUP}",
        f"rollout.max_new_tokens={job.tokens}", f"rollout.temperature={TEMPERATURE}",
        f"train.steps={job.warmup + job.steps}", f"train.lr={learning_rate(w, job.tuning)}",
        f"train.threads={job.threads}", f"train.seed={SEED}", "eval.every=0",
        f"train.micro_batch_tokens={w.get('micro_batch_tokens', 0)}",  # memory only: same math
        "checkpoint.every=0", "progress=false",
        "device=cpu",  # TRL runs with use_cpu=True: the CPU here too
        f"train.compute_dtype={COMPUTE_DTYPE[job.precision]}"]
    data = apply_overrides(read_yaml(CONFIG), overrides)
    data["task"] = {"name": w["task"], "options": w["options"]}
    data["model"].update(chat_template=w["chat_template"], system_prompt=w["system_prompt"],
                         lora=dict(LORA) if job.tuning == "lora" else None)
    return build_config(RLVRConfig, data)


def run_rlscale(job: Job) -> dict:
    import torch

    from rlscale.rlvr.loop import train
    from rlscale.runtime.metrics import MetricsLogger, read_metrics

    torch.set_num_threads(job.threads)
    cfg = rlscale_config(job)
    # When each step's metrics are written: the whole loop iteration, guard and logging included.
    logged: list[float] = []
    log = MetricsLogger.log

    def timed_log(self, step, metrics):
        logged.append(time.perf_counter())
        return log(self, step, metrics)

    MetricsLogger.log = timed_log
    prompts = record_prompts()
    train(cfg, overwrite=True)
    rows = read_metrics(job.run_dir)
    series = {key: measured([r[f"time/{key}"] for r in rows], job.warmup)
              for key in ("step_s", "collect_s", "train_s", "update_s")}
    return {**series, "length": measured([r["length/mean"] for r in rows], job.warmup),
            "reward": measured([r["reward/mean"] for r in rows], job.warmup),
            "truncated": measured([r["length/truncated_share"] for r in rows], job.warmup),
            "post_update_stats_steps": sum("policy/kl_new_old" in r for r in rows[job.warmup:]),
            "iteration_s": intervals(logged, job.warmup), "steps": len(rows),
            "prompts": prompts}


def record_prompts() -> list[list[str]]:
    """Each step's prompts as rlscale's loop trains on them (filled in as it trains)."""
    from rlscale.rlvr.rollout_source import InProcessRollouts

    prompts: list[list[str]] = []
    next_batch = InProcessRollouts.next_batch

    def recorded(self, step, policy_version):
        batch, stats = next_batch(self, step, policy_version)
        prompts.append([ex.prompt for ex in batch.examples])
        return batch, stats

    InProcessRollouts.next_batch = recorded
    return prompts


def trl_dataset(job: Job, tokenizer) -> dict:
    """TRL's dataset: the prompts of rlscale's steps, step after step (TRL reads it in order,
    `shuffle_dataset=False`: its batch k is rlscale's step k); with each prompt's example, the
    token ids rlscale samples from for it."""
    from datasets import Dataset

    fmt = formatter(tokenizer, job.workload)
    examples = [ex for batch in step_prompts(make_workload_task(job.workload),
                                             job.warmup + job.steps) for ex in batch]
    prompts = [trl_prompt(ex, job.workload, fmt) for ex in examples]
    keys = [prompt_key(p) for p in prompts]
    return {"dataset": Dataset.from_dict({"prompt": prompts}),
            "example": dict(zip(keys, examples, strict=True)),
            "ids": {k: tokenizer(fmt(ex), add_special_tokens=False)["input_ids"]
                    for k, ex in zip(keys, examples, strict=True)}}


def check_prompts(trainer, data: dict) -> list[dict]:
    """Wraps TRL's prompt tokenisation: for each batch, its examples' prompts and whether
    every prompt's token ids are the ones rlscale samples from (filled in as TRL trains)."""
    checks: list[dict] = []
    tokenize = trainer._tokenize_prompts

    def checked(prompts):
        out = tokenize(prompts)
        checks.append({"prompts": [data["example"][prompt_key(p)].prompt
                                   for p in prompts[::GROUP]],
                       "ids": all([int(t) for t in ids] == data["ids"][prompt_key(p)]
                                  for p, ids in zip(prompts, out[0], strict=True))})
        return out

    trainer._tokenize_prompts = checked
    return checks


def trl_peft_config(tuning: str):
    """LORA as a peft.LoraConfig, exactly as rlscale's `apply_lora` builds it (None: full)."""
    if tuning == "full":
        return None
    from peft import LoraConfig

    return LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                      target_modules=LORA["target_modules"], task_type="CAUSAL_LM")


def trl_config(job: Job):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=job.run_dir, per_device_train_batch_size=PROMPTS * GROUP,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        num_generations=GROUP, max_completion_length=job.tokens, temperature=TEMPERATURE,
        top_p=1.0, top_k=0, beta=0.0, loss_type="grpo", scale_rewards="none",
        learning_rate=learning_rate(job.workload, job.tuning), weight_decay=0.0,
        max_grad_norm=1.0, gradient_checkpointing=False, bf16=job.precision == "bf16",
        fp16=False, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no",
        max_steps=job.warmup + job.steps, seed=SEED, dataloader_num_workers=0,
        shuffle_dataset=False, disable_tqdm=True)


def quiet_hf() -> None:
    import warnings

    from datasets.utils.logging import disable_progress_bar
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")  # TRL's and accelerate's advice for GPU training
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    disable_progress_bar()


def run_trl(job: Job) -> dict:
    import torch

    quiet_hf()
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from rlscale.rlvr.model import load_tokenizer

    torch.set_num_threads(job.threads)
    task = make_workload_task(job.workload)
    tokenizer = load_tokenizer(job.model_path)
    data = trl_dataset(job, tokenizer)
    scored: list[dict] = []  # per batch: when it was scored, lengths, rewards, last token ids

    def verifier(prompts, completions, completion_ids, **_):
        rewards = []
        for prompt, completion in zip(prompts, completions, strict=True):
            example = data["example"][prompt_key(prompt)]  # outside the try: a miss is a bug
            try:
                rewards.append(float(task.verify(completion_text(completion), example)))
            except Exception:  # rlscale scores a verifier error 0 as well
                rewards.append(0.0)
        scored.append({"t": time.perf_counter(), "lengths": [len(ids) for ids in completion_ids],
                       "reward": statistics.mean(rewards),
                       "ends": [ids[-1] for ids in completion_ids]})
        return rewards

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.end.append(time.perf_counter())

    model = AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float32,
                                                 local_files_only=True)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=verifier, args=trl_config(job),
                          train_dataset=data["dataset"], processing_class=tokenizer,
                          callbacks=[timer],
                          peft_config=trl_peft_config(job.tuning))
    trainer.remove_callback(PrinterCallback)  # this process's stdout is one JSON line
    checks = check_prompts(trainer, data)
    trainer.train()
    return trl_result(job, timer, scored, checks, list(trainer.eos_token_ids))


def trl_result(job: Job, timer, scored: list[dict], checks: list[dict],
               eos_ids: list[int]) -> dict:
    windows = list(zip(timer.begin, timer.end, strict=True))
    if len(scored) != len(windows):
        raise RuntimeError(f"TRL scored {len(scored)} batches in {len(windows)} steps")
    # Generation precedes scoring in the same `_prepare_inputs` call: a scoring time inside
    # its step's window puts that step's generation inside it too.
    inside = all(b <= s["t"] <= e for (b, e), s in zip(windows, scored, strict=True))
    ends = Counter(end for s in scored[job.warmup:] for end in s["ends"])
    return {"step_s": measured([e - b for b, e in windows], job.warmup),
            "collect_s": measured([s["t"] - b for (b, _), s in zip(windows, scored, strict=True)],
                                  job.warmup),
            "train_s": measured([e - s["t"] for (_, e), s in zip(windows, scored, strict=True)],
                                job.warmup),
            "length": measured([statistics.mean(s["lengths"]) for s in scored], job.warmup),
            "reward": measured([s["reward"] for s in scored], job.warmup),
            "truncated": measured([sum(end not in eos_ids for end in s["ends"]) / len(s["ends"])
                                   for s in scored], job.warmup),
            "eos_ids": eos_ids, "ended_at": {str(i): ends[i] for i in eos_ids},
            "prompts": [c["prompts"] for c in checks],
            "prompt_ids_match": len(checks) == len(windows) and all(c["ids"] for c in checks),
            "generation_in_window": inside, "iteration_s": intervals(timer.end, job.warmup),
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


def prompt_tokens(model_path: Path, workload: dict) -> float:
    """Mean prompt length in tokens of the workload, rendered for the model in `model_path`
    (its tokenizer, the workload's chat template and system prompt)."""
    from rlscale.rlvr.model import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    fmt = formatter(tokenizer, workload)
    examples = [ex for batch in step_prompts(make_workload_task(workload), 8) for ex in batch]
    return statistics.mean(len(tokenizer(fmt(ex), add_special_tokens=False)["input_ids"])
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
                mean_length: float | None = None, tuning: str = "full") -> float:
    """Seconds a step cannot go below here: each of `tokens` decode steps reads the fp32
    weights once (at the measured bandwidth) or does its 2 N FLOPs per row (at matmul peak),
    whichever is slower; the update does 6 N FLOPs per token of every row (LoRA: 4 N, no
    weight gradients for the frozen weights), at matmul peak.

    Without `mean_length` every row counts for the full budget. With it (the rows' mean
    completion length as sampled), the bound at those lengths: the batch still runs `tokens`
    decode steps (its longest row), each reading the weights, but only the rows still going
    do FLOPs, and the update trains on the tokens sampled; a step cannot beat this one
    either, and at long budgets, where rows end early, it is the one that measures distance."""
    peak = rates[f"{precision}_flops"]
    rows = PROMPTS * GROUP
    length = tokens if mean_length is None else mean_length
    decode = max(tokens * 4 * params / rates["bandwidth"], 2 * params * rows * length / peak)
    update = UPDATE_FLOPS[tuning] * params * rows * (prompt + length) / peak
    return decode + update


# -- the driver ----------------------------------------------------------------------------
def run_child(system: str, job: Job) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", system,
           "--job", json.dumps(dataclasses.asdict(job))]
    threads = str(job.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        sys.exit(f"error: the {system} run in {job.run_dir} failed (exit {proc.returncode}):\n"
                 f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def summary(runs: list[dict]) -> dict:
    """Min and median of the step-end to step-end interval (everything a loop does per step:
    rlscale's non-finite-guard snapshot and logging included), and of the timed step."""
    steps = [s for run in runs for s in run["iteration_s"]]
    timed = [s for run in runs for s in run["step_s"]]

    def mean_of(key: str) -> float | None:
        values = [x for run in runs for x in run.get(key, [])]
        return statistics.mean(values) if values else None

    out = {"min_s": min(steps), "median_s": statistics.median(steps),
           "step_median_s": statistics.median(timed),
           "collect_median_s": statistics.median(s for run in runs for s in run["collect_s"]),
           "train_median_s": statistics.median(s for run in runs for s in run["train_s"]),
           "mean_length": mean_of("length"), "mean_reward": mean_of("reward"),
           "truncated_share": mean_of("truncated")}
    updates = [s for run in runs for s in run.get("update_s", [])]
    out["update_median_s"] = statistics.median(updates) if updates else None
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small,medium",
                        help="presets, and NAME=PATH for a model in a local folder")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--task", help="the task whose prompts and verifier both sides use "
                        "(default arithmetic)")
    source.add_argument("--config", help="an rlvr train config: its task, chat template, "
                        "system prompt and train.lr on both sides")
    parser.add_argument("--tokens", default="16,128,256",
                        help="completion tokens, comma-separated")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at each run's start")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="fp32,bf16",
                        help="fp32 and/or bf16 (autocast, fp32 weights), comma-separated")
    parser.add_argument("--tuning", default="full",
                        help="full and/or lora (LoRA adapters on both sides), comma-separated")
    parser.add_argument("--out", default="runs/vs_trl")
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    return parser.parse_args()


def model_specs(text: str) -> dict[str, str]:
    """--models as {name: local folder, or "" for a preset}; a missing folder is an error."""
    specs = dict(spec.split("=", 1) if "=" in spec else (spec, "") for spec in text.split(","))
    for name, folder in specs.items():
        if folder and not (Path(folder) / "config.json").is_file():
            hint = (" (`make smollm` imports SmolLM2-135M-Instruct into runs/smollm/base)"
                    if "smollm" in folder.lower() else "")
            sys.exit(f"error: --models {name}={folder}: no Hugging Face model folder there{hint}")
    return specs


def tunings(text: str) -> list[str]:
    chosen = text.split(",")
    unknown = [t for t in chosen if t not in TUNINGS]
    if unknown:
        sys.exit(f"error: --tuning {','.join(unknown)}: choose from {', '.join(TUNINGS)}")
    if "lora" in chosen and importlib.util.find_spec("peft") is None:
        sys.exit("error: --tuning lora needs peft: pip install -e '.[lora]'")
    return chosen


def prepare_models(specs: dict[str, str], out: Path, workload: dict) -> dict[str, dict]:
    """Each model's folder (presets initialised and saved once), size and prompt length."""
    from rlscale.rlvr.model import count_parameters, init_model, load_model

    models = {}
    for name, folder in specs.items():
        path = (Path(folder).resolve() if folder else
                init_model(name, out / "models" / name, seed=SEED, overwrite=True).resolve())
        models[name] = {"path": path, "params_m": count_parameters(load_model(path)[0]) / 1e6,
                        "prompt_tokens": prompt_tokens(path, workload)}
        print(f"model {name}: {models[name]['params_m']:.1f} M parameters, prompts "
              f"{models[name]['prompt_tokens']:.1f} tokens on average")
    return models


def run_cells(cells: list[tuple], models: dict, workload: dict, args) -> dict:
    """Every cell's runs, both sides, repeats interleaved (alternating which side goes first)."""
    runs = {cell: {"rlscale": [], "trl": []} for cell in cells}
    out = Path(args.out)
    for repeat in range(args.repeats):
        order = ("rlscale", "trl") if repeat % 2 == 0 else ("trl", "rlscale")
        for cell in cells:
            precision, tuning, name, tokens = cell
            for system in order:
                run_dir = (out / "runs" / f"{precision}_{tuning}_{name}_{tokens}" /
                           f"{system}_{repeat}").resolve()
                job = Job(str(models[name]["path"]), str(run_dir), tokens, args.steps,
                          args.warmup, args.threads, precision, tuning, workload)
                t0 = time.perf_counter()
                result = run_child(system, job)
                runs[cell][system].append(result)
                print(f"  repeat {repeat}: {precision} {tuning} {name} {tokens} tokens, {system}: "
                      f"median step {statistics.median(result['step_s']):.3f} s "
                      f"({time.perf_counter() - t0:.0f} s with start-up)", file=sys.stderr)
    return runs


TABLE_HEAD = (
    "| precision | tuning | model | completion tokens | rlscale min / median s | "
    "TRL min / median s | TRL / rlscale | rlscale collect / train s | "
    "TRL generate+score / rest s | mean length rlscale / TRL | lower bound s | "
    "rlscale / bound | TRL / bound | at the sampled lengths: bound rlscale / TRL s | "
    "rlscale / its bound | TRL / its bound |\n"
    "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
    "---: | ---: | ---: |")


def same_prompts(runs: dict) -> bool:
    """Whether each repeat's TRL batches had the prompts of its rlscale steps, in order."""
    return all(ours["prompts"] == theirs["prompts"]
               for ours, theirs in zip(runs["rlscale"], runs["trl"], strict=True))


def cell_result(cell: tuple, runs: dict, model: dict, rates: dict, workload: dict) -> dict:
    precision, tuning, name, tokens = cell
    ours, theirs = (summary(runs[cell][s]) for s in ("rlscale", "trl"))
    params = model["params_m"] * 1e6
    bound = lower_bound(params, model["prompt_tokens"], tokens, rates, precision, tuning=tuning)
    sampled = {side: lower_bound(params, model["prompt_tokens"], tokens, rates, precision,
                                 result["mean_length"], tuning)
               for side, result in (("rlscale", ours), ("trl", theirs))}
    # The update's useful FLOP rate: 6 N (LoRA 4 N) per completion token, over its time.
    useful = (UPDATE_FLOPS[tuning] * params * PROMPTS * GROUP * ours["mean_length"]
              / ours["update_median_s"])
    return {"precision": precision, "tuning": tuning, "model": name,
            "params_m": model["params_m"], "prompt_tokens": model["prompt_tokens"],
            "tokens": tokens, "lr": learning_rate(workload, tuning), "rlscale": ours,
            "trl": theirs, "trl_over_rlscale": theirs["median_s"] / ours["median_s"],
            "lower_bound_s": bound, "lower_bound_at_sampled_lengths_s": sampled,
            "update_useful_flops": useful, "same_prompts": same_prompts(runs[cell]),
            "prompt_ids_match": all(r["prompt_ids_match"] for r in runs[cell]["trl"]),
            "update_useful_share_of_fp32_peak": useful / rates["fp32_flops"], "runs": runs[cell]}


def table_row(c: dict) -> str:
    ours, theirs, bound = c["rlscale"], c["trl"], c["lower_bound_s"]
    sampled = c["lower_bound_at_sampled_lengths_s"]
    return (f"| {c['precision']} | {c['tuning']} | {c['model']} ({c['params_m']:.1f} M) | "
            f"{c['tokens']} | {ours['min_s']:.3f} / {ours['median_s']:.3f} | "
            f"{theirs['min_s']:.3f} / {theirs['median_s']:.3f} | {c['trl_over_rlscale']:.2f}x | "
            f"{ours['collect_median_s']:.3f} / {ours['train_median_s']:.3f} | "
            f"{theirs['collect_median_s']:.3f} / {theirs['train_median_s']:.3f} | "
            f"{ours['mean_length']:.1f} / {theirs['mean_length']:.1f} | {bound:.3f} | "
            f"{ours['median_s'] / bound:.2f}x | {theirs['median_s'] / bound:.2f}x | "
            f"{sampled['rlscale']:.3f} / {sampled['trl']:.3f} | "
            f"{ours['median_s'] / sampled['rlscale']:.2f}x | "
            f"{theirs['median_s'] / sampled['trl']:.2f}x |")


def label(c: dict) -> str:
    return f"{c['precision']} {c['tuning']} {c['model']} {c['tokens']}"


def print_checks(cell_results: list[dict]) -> None:
    """Whether both sides ran the same workload, and where rlscale's update stands."""
    outside = [label(c) for c in cell_results
               if not all(r["generation_in_window"] for r in c["runs"]["trl"])]
    if outside:
        print(f"warning: TRL scored a batch outside its step window in {', '.join(outside)}")
    for key, what in (("same_prompts", "prompts"), ("prompt_ids_match", "prompt token ids")):
        differ = [label(c) for c in cell_results if not c[key]]
        if differ:
            print(f"warning: TRL's {what} differ from rlscale's in {', '.join(differ)}")
    print("\nTRL / rlscale > 1: rlscale is faster (ratio of the median step-end to step-end times).")
    print("\nthe same work on both sides: mean reward, truncated share (rows that ran the whole "
          "budget) rlscale / TRL; the ids TRL's rows ended at:")
    for c in cell_results:
        ours, theirs = c["rlscale"], c["trl"]
        ended = sum((Counter(r["ended_at"]) for r in c["runs"]["trl"]), Counter())
        print(f"  {label(c)}: reward {ours['mean_reward']:.3f} / {theirs['mean_reward']:.3f}, "
              f"truncated {ours['truncated_share']:.2f} / {theirs['truncated_share']:.2f}, "
              f"TRL ended at {dict(ended)}")
    print("\nrlscale's update, useful FLOP rate (6 x parameters x completion tokens / update "
          "time; LoRA 4 x) against the measured fp32 matmul peak:")
    for c in cell_results:
        print(f"  {label(c)}: {c['update_useful_flops'] / 1e9:.0f} GFLOP/s = "
              f"{100 * c['update_useful_share_of_fp32_peak']:.0f}% of fp32 peak")


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](Job(**json.loads(args.job)))))
        return
    if importlib.util.find_spec("trl") is None:
        sys.exit(NOT_INSTALLED)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    specs, chosen = model_specs(args.models), tunings(args.tuning)
    workload = load_workload(args.config, args.task)
    out = Path(args.out)
    versions = {name: version(name) for name in ("torch", "transformers", "trl", "peft")
                if importlib.util.find_spec(name) is not None}
    print(", ".join(f"{k} {v}" for k, v in versions.items()) +
          f"; {args.threads} thread(s); CPU flags: {cpu_flags()}")
    print(f"workload: {workload['task']}"
          f"{' ' + json.dumps(workload['options']) if workload['options'] else ''}"
          f"{' (chat template)' if workload['chat_template'] else ''}, {PROMPTS} prompts x "
          f"{GROUP} completions per step, temperature {TEMPERATURE}, AdamW lr "
          f"{workload['lr']:g} (LoRA x{LORA_LR_SCALE:g}: {LORA}), CPU; random-init presets "
          f"(EOS is rare: every batch runs the full budget, its rows end at their EOS) and "
          f"local models as saved; {args.warmup} warmup + {args.steps} measured steps per run, "
          f"{args.repeats} interleaved repeat(s)")
    rates = machine_rates(args.threads)
    print(f"machine: fp32 matmul {rates['fp32_flops'] / 1e9:.0f} GFLOP/s, bf16 matmul "
          f"{rates['bf16_flops'] / 1e9:.0f} GFLOP/s, memory bandwidth "
          f"{rates['bandwidth'] / 1e9:.1f} GB/s")
    models = prepare_models(specs, out, workload)
    cells = [(p, t, name, tokens) for p in args.precision.split(",") for t in chosen
             for name in models for tokens in (int(x) for x in args.tokens.split(","))]
    runs = run_cells(cells, models, workload, args)
    cell_results = [cell_result(cell, runs, models[cell[2]], rates, workload) for cell in cells]
    print("\n" + TABLE_HEAD)
    for c in cell_results:
        print(table_row(c))
    print_checks(cell_results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({
        "versions": versions, "threads": args.threads, "steps": args.steps,
        "warmup": args.warmup, "repeats": args.repeats, "prompts_per_step": PROMPTS,
        "group_size": GROUP, "lr": workload["lr"], "lora": LORA, "lora_lr_scale": LORA_LR_SCALE,
        "temperature": TEMPERATURE, "task": workload["task"], "workload": workload,
        "models": {name: str(m["path"]) for name, m in models.items()}, "machine": rates,
        "prompt_tokens": {name: m["prompt_tokens"] for name, m in models.items()},
        "cells": cell_results}, indent=1))
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
