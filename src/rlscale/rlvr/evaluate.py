"""Held-out evaluation: unbiased pass@k from n samples per prompt."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

import torch

from ..config import read_yaml
from ..runtime.checkpoint import list_checkpoints
from ..runtime.device import compute_context, resolve_compute_dtype
from ..runtime.metrics import Heartbeat
from .config import EvalConfig, RLVRConfig, load_command_config
from .model import ModelLoadError, PromptFormatter, load_model
from .rewards import VerifierPool, score_completions
from .rollout.engine import generate_with_tools
from .rollout.groups import rollout_from_completions
from .rollout.sampler import SamplingParams, decode_completions, generate
from .rollout.types import EngineSampling, ToolTurns
from .tasks import Example, Task, examples, make_task
from .tools import ToolsConfig
from .trace_stats import behaviour_means, by_difficulty, length_by_outcome, mean_by_difficulty


def pass_at_k(n: int, c: int, k: int) -> float:
    """`1 - C(n-c, k) / C(n, k)`: the chance that k of the n samples include a correct one."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # The product form avoids huge binomials: C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i).
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class EvalResult:
    pass_at: dict[int, float]
    n: int                  # prompts evaluated
    samples: int            # samples per prompt
    mean_length: float      # completion tokens, EOS included
    seconds: float
    per_prompt_correct: list[int]
    # length/right_mean, length/wrong_mean, behaviour/<counter> (trace tasks) and
    # difficulty/<level>/{accuracy,mean_length,share} (tasks with a difficulty): trace_stats
    details: dict[str, float] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list, repr=False)  # the completions, prompt-major
    examples: list[Example] = field(default_factory=list, repr=False)  # one per prompt

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = {f"pass@{k}": v for k, v in self.pass_at.items()}
        out.update(n=self.n, samples=self.samples, mean_length=self.mean_length,
                   seconds=self.seconds, **self.details)
        return out


# The completion budget of a task that names none of its own (a data file, reasoning-gym).
DEFAULT_MAX_NEW_TOKENS = 8


def task_max_new_tokens(task: Task) -> int:
    """The completion budget `task`'s answers need: a built-in task's `max_new_tokens` (its
    training recipe's rollout.max_new_tokens), else DEFAULT_MAX_NEW_TOKENS."""
    return int(getattr(task, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS))


@dataclass(frozen=True)
class EvalModel:
    """What `--model PATH` names: the model folder to load and, when PATH is a `rlvr train`
    run directory, the run's recorded config (its task, prompt format and budget)."""

    folder: Path
    run_config: Path | None = None


def find_eval_model(path: str | Path) -> EvalModel:
    """`path` as a model folder, or a `rlvr train` run directory as its `final/` model, else
    its newest checkpoint that is a whole model (a LoRA run's checkpoints hold adapters
    only). Anything else is left to the loader, which names what is wrong with it."""
    path = Path(path)
    if (path / "config.json").is_file() or not path.is_dir():
        return EvalModel(path)
    recorded = path / "config.yaml"
    if not recorded.is_file() and not (path / "checkpoints").is_dir():
        return EvalModel(path)  # not a run directory
    out = read_yaml(recorded).get("out") if recorded.is_file() else None
    if isinstance(out, str):  # `rlscale sft` writes its model to `out`, not to the run's final/
        raise ModelLoadError(f"{path} is an `rlscale sft` run directory: its model is {out} "
                             "(pass that as --model)")
    for folder in (path / "final", *reversed(list_checkpoints(path))):
        if (folder / "config.json").is_file():
            return EvalModel(folder, recorded if recorded.is_file() else None)
    raise ModelLoadError(f"run directory {path} holds no model to evaluate (no final/ or "
                         "checkpoints/step_*/ with a config.json)")


def check_eval_arguments(*, prompts: int, samples: int, ks: tuple[int, ...],
                         max_new_tokens: int, temperature: float, top_p: float) -> None:
    """One-line ValueErrors for arguments no evaluation can use (before any model work).
    Temperature 0 is greedy decoding: one sample per prompt says all it can."""
    if prompts < 1:
        raise ValueError(f"--prompts must be at least 1, got {prompts}")
    if samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    if not ks or min(ks) < 1:
        raise ValueError(f"--k needs positive integers, got {list(ks)}")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"--temperature must be 0 (greedy) or a positive number, got {temperature}")
    if temperature == 0 and samples > 1:
        raise ValueError(f"--temperature 0 decodes greedily, so every sample of a prompt is the "
                         f"same: use one sample (--samples 1 --k 1), got {samples}")
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise ValueError(f"--top-p must be in (0, 1], got {top_p}")


def _complete(model, tokenizer, ids: list[list[int]], params: SamplingParams,
              generator: torch.Generator, tools: ToolTurns | None, seed: int):
    """The completions of one batch of prompt ids: the sampler, or with tools the engine."""
    if tools is None:
        return generate(model, ids, params, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, generator=generator)
    completions, _ = generate_with_tools(
        model, ids, EngineSampling(params.temperature, params.top_p), params.max_new_tokens,
        tools, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        seed=seed)
    return rollout_from_completions(completions, tokenizer.pad_token_id)


def evaluate(model, tokenizer, task: Task, *, split: str = "test", seed: int = 0,
             prompts: int = 500, samples: int = 1, ks: tuple[int, ...] = (1,),
             max_new_tokens: int = 16, temperature: float = 1.0, top_p: float = 1.0,
             chat_template: bool = False, system_prompt: str | None = None,
             batch_size: int = 512, compute_dtype: str = "float32",
             verifiers: VerifierPool | None = None,
             tools: ToolTurns | None = None, progress: bool = False) -> EvalResult:
    """`verifiers`: the run's pool for `task` (its workers, deadline and memory limit);
    without one, completions are scored in the shared one-worker pool. `tools`: the model
    may call them while it generates (rollout.tools); the details then say how often.
    `progress`: a line on stderr every ~10 s (the command's own evaluations; a training
    run's held-out ones have the run's progress bar). `compute_dtype`: float32, bfloat16
    (autocast, fp32 weights) or auto (`resolve_compute_dtype`'s rule)."""
    check_eval_arguments(prompts=prompts, samples=samples, ks=ks, max_new_tokens=max_new_tokens,
                         temperature=temperature, top_p=top_p)
    if max(ks) > samples:
        raise ValueError(f"pass@{max(ks)} needs at least {max(ks)} samples per prompt, got {samples}")
    start = time.perf_counter()
    model.eval()
    device = next(model.parameters()).device
    dtype = resolve_compute_dtype(compute_dtype, device).name
    fmt = PromptFormatter(tokenizer, chat_template, system_prompt)
    items = examples(task, split, seed, prompts)
    expanded = [ex for ex in items for _ in range(samples)]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    generator = torch.Generator().manual_seed(seed)
    rewards: list[float] = []
    lengths: list[int] = []
    texts: list[str] = []
    calls: list[int] = []
    beat = Heartbeat(f"eval {task.name} {split}", enabled=progress).beat
    for lo in range(0, len(expanded), batch_size):
        beat(f"{lo}/{len(expanded)} completions")
        chunk = expanded[lo: lo + batch_size]
        ids = [tokenizer(fmt(ex), add_special_tokens=False)["input_ids"] for ex in chunk]
        with compute_context(device, dtype):
            rollout = _complete(model, tokenizer, ids, params, generator, tools,
                                seed * 1_000_003 + lo)
        if tools is not None:
            calls.extend(rollout.tool_calls().tolist())
        chunk_texts = decode_completions(tokenizer, rollout)
        scored = (verifiers.score(chunk_texts, chunk) if verifiers is not None
                  else score_completions(task, chunk_texts, chunk))
        rewards.extend(scored.rewards)
        lengths.extend(rollout.lengths.tolist())
        texts.extend(chunk_texts)
    correct = [sum(r > 0.5 for r in rewards[i * samples:(i + 1) * samples])
               for i in range(len(items))]
    pass_at = {k: sum(pass_at_k(samples, c, k) for c in correct) / len(items) for k in ks}
    right = [r > 0.5 for r in rewards]
    details = {**length_by_outcome(lengths, right), **behaviour_means(task, texts, expanded),
               **by_difficulty(task, expanded, lengths, right)}
    if tools is not None:
        details["tools/calls_per_rollout"] = sum(calls) / max(len(calls), 1)
        details.update(mean_by_difficulty(task, expanded, calls, "tool_calls"))
    return EvalResult(pass_at=pass_at, n=len(items), samples=samples,
                      mean_length=sum(lengths) / max(len(expanded), 1),
                      seconds=time.perf_counter() - start, per_prompt_correct=correct,
                      details=details, texts=texts, examples=items)


@dataclass(frozen=True)
class EvalPlan:
    """What an EvalConfig resolves to before the model loads: the model folder, the task, the
    prompt format, the completion budget and the tools the model may call."""

    folder: Path
    task: Task
    max_new_tokens: int
    chat_template: bool = False
    system_prompt: str | None = None
    tools: ToolsConfig | None = None


def plan_eval(cfg: EvalConfig) -> EvalPlan:
    """Find the model and build the task (by name, or from a train config: the given one, else
    the run directory's own); every user error is raised here, before the model loads."""
    found = find_eval_model(cfg.model)
    # a run directory alone is evaluated as it trained: its recorded config
    train_config = cfg.config if cfg.task is not None or cfg.config is not None else found.run_config
    if (cfg.task is None) == (train_config is None):
        raise ValueError("give --task NAME or --config CONFIG (a train config), not both")
    if train_config is not None:
        run = load_command_config(RLVRConfig, train_config, [f"model.path={found.folder}"])
        task = make_task(run.task.name, **run.task.options)
        plan = EvalPlan(found.folder, task, cfg.max_new_tokens or run.rollout.max_new_tokens,
                        cfg.chat_template or run.model.chat_template, run.model.system_prompt,
                        run.rollout.tools if run.rollout.tools.tools else None)
    else:
        task = make_task(cfg.task)
        plan = EvalPlan(found.folder, task, cfg.max_new_tokens or task_max_new_tokens(task),
                        cfg.chat_template)
    check_eval_arguments(prompts=cfg.eval.prompts, samples=cfg.samples, ks=tuple(cfg.ks),
                         max_new_tokens=plan.max_new_tokens, temperature=cfg.eval.temperature,
                         top_p=cfg.top_p)
    task.sample(cfg.split, Random(cfg.eval.seed))  # a split the task lacks fails here
    return plan


def run_eval(cfg: EvalConfig, plan: EvalPlan, progress: bool = True) -> EvalResult:
    """Load the planned model (and start its tools) and evaluate it as `cfg` says."""
    model, tokenizer = load_model(plan.folder)
    with contextlib.ExitStack() as stack:
        tools = None
        if plan.tools is not None:
            from .tool_turns import RunnerToolTurns

            tools = RunnerToolTurns.from_config(plan.tools, tokenizer)
            stack.callback(tools.close)
        return evaluate(model, tokenizer, plan.task, split=cfg.split, seed=cfg.eval.seed,
                        prompts=cfg.eval.prompts, samples=cfg.samples, ks=tuple(cfg.ks),
                        max_new_tokens=plan.max_new_tokens, temperature=cfg.eval.temperature,
                        top_p=cfg.top_p, chat_template=plan.chat_template,
                        system_prompt=plan.system_prompt, tools=tools, progress=progress,
                        compute_dtype=cfg.eval.compute_dtype)
