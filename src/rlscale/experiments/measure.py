"""Measurements of the models an experiment trained: pass@k with the run's own task and
token budget (`rlvr.evaluate`), and how far a model drifted from a reference.

`rollout_source` and `policy_batch` draw groups and turn them into the trainer's batch the
way a training step does, for experiments that measure the library's pieces on a model
without a training run.

The drift is made of the library's pieces: the task's held-out prompts (`tasks.examples`),
the RL sampler (`rollout.sampler.generate`), the trainer's forward
(`logprobs.completion_logprobs`) and the loss's KL estimator (`token_math.kl_penalty`, k3):
the same per-token figure a run logs as `kl/mean` when its KL coefficient is above 0, here
for any model, beta = 0 included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..rlvr import token_math
from ..rlvr.batch import PolicyBatch, build_policy_batch
from ..rlvr.config import RLVRConfig
from ..rlvr.evaluate import EvalResult, evaluate
from ..rlvr.logprobs import completion_logprobs
from ..rlvr.model import PromptFormatter, load_model, precision_workload
from ..rlvr.rewards import VerifierPool
from ..rlvr.rollout.groups import RolloutGroup
from ..rlvr.rollout.sampler import SamplingParams, generate
from ..rlvr.rollout_source import InProcessRollouts
from ..rlvr.step_loss import StepLoss
from ..rlvr.tasks import Task, examples, make_task
from ..rlvr.tool_turns import RunnerToolTurns
from ..rlvr.trainer import PolicyTrainer
from ..runtime.device import resolve_compute_dtype
from .setup import Context, TrainedArm, windowed_curves
from .spec import CurveBudget, HeldOutBudget, Numbers
from .stats import by_seed


def run_task(cfg: RLVRConfig) -> Task:
    return make_task(cfg.task.name, **cfg.task.options)


def pass_at(model_path: Path, cfg: RLVRConfig, *, split: str, seed: int, prompts: int,
            samples: int, ks: tuple[int, ...], tools: bool = True) -> EvalResult:
    """Held-out pass@k of a model with the task, token budget, temperature and tools
    (rollout.tools; none with `tools=False`) of the run config `cfg` (as `rlscale rlvr eval
    --config` measures it)."""
    model, tokenizer = load_model(model_path)
    with contextlib.ExitStack() as stack:
        turns = None
        if tools and cfg.rollout.tools.tools:
            turns = RunnerToolTurns.from_config(cfg.rollout.tools, tokenizer)
            stack.callback(turns.close)
        return evaluate(model, tokenizer, run_task(cfg), split=split, seed=seed,
                        prompts=prompts, samples=samples, ks=ks,
                        max_new_tokens=cfg.rollout.max_new_tokens,
                        temperature=cfg.eval.temperature, tools=turns)


def held_out(model_path: Path, cfg: RLVRConfig, *, seed: int, budget: HeldOutBudget,
             split: str = "test", tools: bool = True) -> EvalResult:
    """pass@1 of a model on `budget`'s held-out prompts x samples of `split`, drawn with
    `seed` (a seed's models are measured on the same prompts, so arms pair by seed)."""
    return pass_at(model_path, cfg, split=split, seed=seed, prompts=budget.prompts,
                   samples=budget.samples, ks=(1,), tools=tools)


def curve_start(model_path: Path, cfg: RLVRConfig) -> float:
    """pass@1 on the prompts a run of `cfg` evaluates during training (`eval.*`): the
    point at step 0 of its training curve, for the model it starts from."""
    e = cfg.eval
    return pass_at(model_path, cfg, split="test", seed=e.seed, prompts=e.prompts,
                   samples=e.samples, ks=(1,)).pass_at[1]


def by_level(details: dict[str, float], name: str) -> dict[str, float]:
    """{level: value} from evaluate's `difficulty/<level>/<name>` details (string keys, as
    JSON keeps them)."""
    out = {}
    for key, value in details.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "difficulty" and parts[2] == name:
            out[parts[1]] = value
    return out


@contextlib.contextmanager
def rollout_source(model, tokenizer, cfg: RLVRConfig) -> Iterator[InProcessRollouts]:
    """The sync loop's own sampler and verifier pool on `model`: `source.draw(step, 0, 0)`
    gives `rollout.prompts_per_step` prompts x `rollout.group_size` scored completions of the
    `train` split, seeded by `train.seed` and `step` as a training step's."""
    task = run_task(cfg)
    with VerifierPool.from_config(task, cfg.task) as pool:
        yield InProcessRollouts(model, tokenizer, task, cfg, pool, dynamic_sampling=False)


def policy_batch(group: RolloutGroup, advantages: torch.Tensor, pad_token_id: int) -> PolicyBatch:
    """The trainer's batch of a scored group with the given `[B]` advantages (as the loop
    builds it)."""
    r = group.rollout
    return build_policy_batch(r.prompt_ids, r.completion_ids, r.mask, advantages,
                              r.sampler_logprobs, pad_token_id, r.policy_version, r.versions(),
                              r.tool_mask)


def policy_trainer(model, cfg: RLVRConfig) -> PolicyTrainer:
    """The learner of a run of `cfg` on `model` (no reference: the KL term needs none at
    kl_coef 0, which is what the measurements here use), as `rlvr.loop` builds it."""
    device = next(model.parameters()).device
    return PolicyTrainer(model, None, StepLoss(cfg.resolved_objective()), cfg.train,
                         temperature=cfg.rollout.temperature,
                         compute_dtype=resolve_compute_dtype(cfg.train.compute_dtype, device,
                                                             precision_workload(model)).name)


def own_samples(model, tokenizer, task: Task, *, split: str, seed: int, prompts: int,
                samples: int, max_new_tokens: int, temperature: float) -> PolicyBatch:
    """`prompts` x `samples` completions `model` samples itself on the task's `split`, as the
    trainer's batch (zero advantages: for measuring, not training)."""
    fmt = PromptFormatter(tokenizer)
    items = [ex for ex in examples(task, split, seed, prompts) for _ in range(samples)]
    ids = [tokenizer(fmt(ex), add_special_tokens=False)["input_ids"] for ex in items]
    rollout = generate(model, ids, SamplingParams(max_new_tokens, temperature, 1.0),
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       generator=torch.Generator().manual_seed(seed))
    return build_policy_batch(rollout.prompt_ids, rollout.completion_ids, rollout.mask,
                              torch.zeros(len(items)), rollout.sampler_logprobs,
                              tokenizer.pad_token_id, policy_version=0)


@dataclass(frozen=True)
class OwnSamples:
    """Completions a model sampled itself, scored by it and by a second model."""

    batch: PolicyBatch
    tokenizer: Any
    logp: torch.Tensor        # [B, T] the sampling model's per-token log-probs
    entropy: torch.Tensor     # [B, T] its entropy per token
    other_logp: torch.Tensor  # [B, T] the second model's log-probs of the same tokens


@torch.no_grad()
def scored_own_samples(sampler_path: Path, other_path: Path, task: Task, *, split: str,
                       seed: int, prompts: int, samples: int, max_new_tokens: int,
                       temperature: float) -> OwnSamples:
    """`prompts` x `samples` completions the model in `sampler_path` samples itself at
    `temperature`, with its log-probs and entropy and the model in `other_path`'s log-probs."""
    sampler, tokenizer = load_model(sampler_path)
    other, _ = load_model(other_path)
    sampler.eval()
    other.eval()
    batch = own_samples(sampler, tokenizer, task, split=split, seed=seed, prompts=prompts,
                        samples=samples, max_new_tokens=max_new_tokens, temperature=temperature)
    logp, entropy = completion_logprobs(sampler, batch, temperature, with_entropy=True)
    other_logp, _ = completion_logprobs(other, batch, temperature)
    return OwnSamples(batch, tokenizer, logp, entropy, other_logp)


@dataclass(frozen=True)
class Drift:
    kl_to_reference: float   # per completion token, k3 on the model's own samples
    entropy: float           # the model's entropy per completion token, on those samples
    tokens: int              # completion tokens measured


@torch.no_grad()
def drift(model_path: Path, reference_path: Path, task: Task, *, split: str = "test",
          seed: int = 0, prompts: int = 64, samples: int = 4, max_new_tokens: int = 64,
          temperature: float = 1.0) -> Drift:
    """KL(model || reference) and the model's entropy per token, on `prompts` x `samples`
    completions the model samples itself at `temperature`."""
    own = scored_own_samples(model_path, reference_path, task, split=split, seed=seed,
                             prompts=prompts, samples=samples, max_new_tokens=max_new_tokens,
                             temperature=temperature)
    mask = own.batch.mask
    kl = token_math.kl_penalty(own.logp, own.other_logp, "k3")
    return Drift(kl_to_reference=float(token_math.masked_mean(kl, mask)),
                 entropy=float(token_math.masked_mean(own.entropy, mask)),
                 tokens=int(mask.sum()))


@dataclass(frozen=True)
class Forking:
    """Where a trained model's change from its base lands, on the base's own samples."""

    top_share: float         # share of sum |d log p| on the top-rho tokens by base entropy
    random_share: float      # the same for random masks of the same size (mean of draws)
    top_entropy: float       # mean base entropy of the top-rho tokens
    entropy: float           # mean base entropy of all completion tokens
    tokens: int              # completion tokens measured
    forks: list[tuple[str, int, int]]  # (token text, times in the top-rho, times overall)
    examples: list[str]      # completions with each top-rho token marked [like this]


@torch.no_grad()
def forking(model_path: Path, base_path: Path, task: Task, *, rho: float = 0.2,
            split: str = "test", seed: int = 0, prompts: int = 64, samples: int = 4,
            max_new_tokens: int = 64, temperature: float = 1.0, draws: int = 32,
            top_tokens: int = 12, shown: int = 3) -> Forking:
    """How much of the change from `base` to `model` (|log p_model - log p_base| per token)
    falls on the base's top-`rho` tokens by entropy (token_math.top_entropy_mask, the mask
    `loss.entropy_top_rho` trains on), against `draws` random masks of the same size, on
    `prompts` x `samples` completions the base samples itself."""
    own = scored_own_samples(base_path, model_path, task, split=split, seed=seed,
                             prompts=prompts, samples=samples, max_new_tokens=max_new_tokens,
                             temperature=temperature)
    batch, entropy = own.batch, own.entropy
    mask = batch.mask > 0
    change = (own.other_logp - own.logp).abs() * mask
    top = token_math.top_entropy_mask(entropy, batch.mask, rho) > 0
    total = float(change.sum())
    random_shares = random_mask_shares(change, mask, int(top.sum()), draws, seed + 1)
    forks, marked = forking_tokens(own.tokenizer, batch.completion_ids, mask, top, top_tokens)
    return Forking(top_share=float(change[top].sum()) / total if total else 0.0,
                   random_share=sum(random_shares) / len(random_shares),
                   top_entropy=float(entropy[top].mean()),
                   entropy=float(entropy[mask].mean()), tokens=int(mask.sum()),
                   forks=forks, examples=marked[::samples][:shown])  # distinct prompts


def random_mask_shares(change: torch.Tensor, mask: torch.Tensor, size: int, draws: int,
                       seed: int) -> list[float]:
    """The share of `change`'s sum on `size` active tokens drawn uniformly, `draws` times:
    the length-matched baseline a top-entropy share is compared with."""
    total = float(change.sum())
    if not total:
        return [0.0] * draws
    generator = torch.Generator().manual_seed(seed)
    active = mask.flatten().nonzero().flatten()
    flat = change.flatten()
    return [float(flat[active[torch.randperm(len(active), generator=generator)[:size]]].sum())
            / total for _ in range(draws)]


def forking_tokens(tokenizer, ids: torch.Tensor, mask: torch.Tensor, top: torch.Tensor,
                   most: int) -> tuple[list[tuple[str, int, int]], list[str]]:
    """The `most` token texts most often among the `top` positions, each with (times in
    top, times overall), and every completion with its top tokens [marked]."""
    counts: dict[str, list[int]] = {}
    marked = []
    for row in range(ids.shape[0]):
        pieces = []
        for col in mask[row].nonzero().flatten().tolist():
            text = tokenizer.decode([int(ids[row, col])])
            tally = counts.setdefault(text, [0, 0])
            tally[1] += 1
            if top[row, col]:
                tally[0] += 1
                text = f"[{text}]"
            pieces.append(text)
        marked.append("".join(pieces))
    forks = sorted(((t, c[0], c[1]) for t, c in counts.items() if c[0]), key=lambda x: -x[1])
    return forks[:most], marked


def measure_curve_arms(ctx: Context, trained: dict[str, list[TrainedArm]], s: CurveBudget,
                       labels: Iterable[str], curves: tuple[str, ...],
                       final_figures: Callable[[Path, RLVRConfig, int, CurveBudget], dict],
                       first: dict[str, dict] | None = None) -> Numbers:
    """Per arm of `labels`: its final models' `final_figures(model, config, seed, s)` per
    seed and the loop's `curves` over training, in windows; `first`: rows measured otherwise
    (e.g. the base), before the arms."""
    out = dict(first or {})
    for label in labels:
        runs = trained[label]
        centres, by_key = windowed_curves(runs, curves, s.steps, s.window)
        out[label] = {**by_seed([final_figures(run.final, run.config(), run.seed, s)
                                 for run in runs]), "curves": by_key, "window_centres": centres}
    return {"seeds": list(ctx.seeds), "steps": s.steps, "prompts": s.prompts,
            "samples": s.samples, "arms": out}
