"""Supervised fine-tuning on task demonstrations: the starting point for RL.

The loss is the per-token policy-gradient loss of `imitation` on the completion tokens
(the prompt is context, not a target), aggregated by token mean: `loss: sft` weighs every
token by 1 (the mean negative log-likelihood, as the Hugging Face `labels` loss), `loss: dft`
by its detached probability (DFT). `data.wrong_share` of the demonstrations are
deliberately corrupted with the task's own `corrupt` (a wrong digit, a broken format), so
the base model puts real probability on wrong answers and RL has measurable headroom to
remove it.

`data.source: teacher` replaces the demonstrations with one completion per prompt sampled
from `teacher.path` (same tokenizer): SFT on teacher samples, the off-policy counterpart of
on-policy distillation (`objective: opd`), whose student samples for itself.
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
import time
from pathlib import Path

import torch

from ..config import config_to_dict, dump_config
from ..runtime import checkpoint as ckpt
from ..runtime import rundir
from ..runtime.device import compute_context, resolve_compute_dtype, resolve_device
from ..runtime.metrics import MetricsLogger, StepProgress
from ..runtime.optim import adamw
from ..runtime.trackers import open_trackers
from . import imitation, lora
from .batch import build_policy_batch
from .config import SFT_RESUME_FREE_FIELDS, SFTConfig
from .logprobs import completion_logprobs
from .model import (
    PromptFormatter,
    build_tiny_model,
    load_model,
    load_teacher,
    precision_workload,
)
from .rollout.sampler import SamplingParams, generate
from .tasks import make_task

TEACHER_BATCH = 256  # prompts per teacher generate() call when sampling demonstrations


def build_demonstrations(cfg: SFTConfig, tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) pairs: the task's demonstrations (some corrupted with
    `data.wrong_share`), or with `data.source: teacher` the teacher's own samples."""
    task = make_task(cfg.task.name, **cfg.task.options)
    if cfg.data.wrong_share > 0 and not hasattr(task, "corrupt"):
        raise ValueError(f"task '{task.name}' cannot make wrong demonstrations (no corrupt())")
    if cfg.data.answer_only and not hasattr(task, "direct_demonstration"):
        raise ValueError(f"task '{task.name}' has no answer-only demonstrations "
                         "(no direct_demonstration()); data.answer_only needs a trace task")
    demonstrate = task.direct_demonstration if cfg.data.answer_only else task.demonstration
    fmt = PromptFormatter(tokenizer, cfg.model.chat_template if cfg.model else False,
                          cfg.model.system_prompt if cfg.model else None)
    rng = random.Random(f"sft:{cfg.data.seed}")
    kinds, shares = _document_shares(cfg, task)
    if cfg.data.source == "teacher":
        prompts = [tokenizer(fmt(task.sample("train", rng)), add_special_tokens=False)["input_ids"]
                   for _ in range(cfg.data.examples)]
        return teacher_samples(cfg, tokenizer, prompts)
    bos = [tokenizer.bos_token_id]
    pairs = []
    for _ in range(cfg.data.examples):
        kind = rng.choices(kinds, weights=shares)[0] if kinds else None
        if kind is not None:
            text = task.document(kind, rng)
            pairs.append((bos, tokenizer(text, add_special_tokens=False)["input_ids"]
                          + [tokenizer.eos_token_id]))
            continue
        ex = task.sample("train", rng)
        wrong = rng.random() < cfg.data.wrong_share
        text = task.corrupt(ex, rng) if wrong else demonstrate(ex, rng)
        prompt = tokenizer(fmt(ex), add_special_tokens=False)["input_ids"]
        completion = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        pairs.append((prompt, completion))
    return pairs


def _document_shares(cfg: SFTConfig, task) -> tuple[list[str | None], list[float]]:
    """`data.documents` as choices for each example (None: a demonstration), checked against
    the task's document kinds; empty when there are none."""
    documents = cfg.data.documents
    if not documents:
        return [], []
    known = getattr(task, "document_kinds", ())
    unknown = sorted(set(documents) - set(known))
    if unknown:
        raise ValueError(f"data.documents: task '{task.name}' has no '{unknown[0]}' documents"
                         f" (known: {', '.join(known) or 'none'})")
    if cfg.data.source != "task":
        raise ValueError("data.documents needs data.source: task")
    if any(not 0 <= share <= 1 for share in documents.values()) or sum(documents.values()) > 1:
        raise ValueError(f"data.documents: shares must lie in [0, 1] and sum to at most 1, "
                         f"got {documents}")
    rest = 1.0 - sum(documents.values())
    return [*documents, None], [*documents.values(), rest]


@torch.no_grad()
def teacher_samples(cfg: SFTConfig, tokenizer, prompts: list[list[int]]
                    ) -> list[tuple[list[int], list[int]]]:
    """One completion per prompt sampled from `cfg.teacher` with the RL sampler, as it came
    (its EOS when it stopped, cut at `data.max_new_tokens` when it did not)."""
    teacher = load_teacher(cfg.teacher.path, cfg.teacher.dtype, tokenizer).to(
        resolve_device(cfg.device))
    params = SamplingParams(cfg.data.max_new_tokens, cfg.data.temperature, 1.0)
    generator = torch.Generator().manual_seed(cfg.data.seed)
    pairs = []
    for start in range(0, len(prompts), TEACHER_BATCH):
        chunk = prompts[start: start + TEACHER_BATCH]
        rollout = generate(teacher, chunk, params, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, generator=generator)
        for prompt, row, n in zip(chunk, rollout.completion_ids.tolist(),
                                  rollout.lengths.tolist(), strict=True):
            pairs.append((prompt, row[:n]))
    return pairs


def collate(pairs: list[tuple[list[int], list[int]]], pad_id: int):
    width = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (p, c) in enumerate(pairs):
        seq = p + c
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        labels[i, len(p): len(seq)] = torch.tensor(c)
    return ids, attention, labels


def packed_target_logprobs(model, pairs: list[tuple[list[int], list[int]]], pad_id: int,
                           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, T]` log-probs of each demonstration's completion tokens and their mask, with the
    sequences packed several to a row (rlvr/layout.py, the trainer's forward): demonstrations
    of very different lengths (reasoning traces) then cost their own tokens, not the
    longest one's. The same values as `target_logprobs` up to float rounding."""
    width = max(len(c) for _, c in pairs)
    completions = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(pairs), width))
    for i, (_, c) in enumerate(pairs):
        completions[i, :len(c)] = torch.tensor(c)
        mask[i, :len(c)] = 1
    zeros = torch.zeros(len(pairs))
    batch = build_policy_batch([p for p, _ in pairs], completions, mask, zeros,
                               torch.zeros_like(mask), pad_id, policy_version=0)
    batch = dataclasses.replace(batch, **{f: getattr(batch, f).to(device) for f in
                                          ("input_ids", "attention_mask", "completion_ids", "mask")})
    logp, _ = completion_logprobs(model, batch, pack=True)
    return logp, batch.mask


def target_logprobs(model, ids: torch.Tensor, attention: torch.Tensor,
                    labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, L - 1]` log pi(y_t | y_<t) of each next token, and the mask of the targets
    (labels other than -100). The logit at position t predicts token t + 1.

    Kept as the full forward and log-softmax gather on purpose: the quickstart's SFT (lr
    3e-3) is chaotic in float rounding, and the trainer's leaner computation
    (rlvr/logprobs.py, the same values to ~1e-7) drifts after ~30 steps into a run whose
    base scores 0.24 held-out pass@1 instead of the documented 0.50; this path reproduces
    the documented base exactly."""
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    targets = labels[:, 1:]
    logp = logits.log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    return logp, (targets != -100).float()


def demonstration_weight(cfg: SFTConfig) -> str:
    """The per-token weight (imitation.DEMONSTRATION_WEIGHTS) of `cfg.loss`: 1 for sft,
    DFT's detached token or sequence probability for dft."""
    return {"sft": "one", "dft": cfg.dft_weight}[cfg.loss]


def sft(cfg: SFTConfig, *, overwrite: bool = False, resume: bool = False,
        allow_config_change: bool = False) -> Path:
    """Fine-tune and write the model to `cfg.out`; `resume` continues the run in
    `cfg.run_dir` from its newest checkpoint, exactly (the same batches and weights as a run
    never stopped)."""
    run_dir, out = Path(cfg.run_dir), Path(cfg.out)
    resolve_device(cfg.device)  # a missing GPU is a one-line error before anything is written
    rundir.check_separate(out, run_dir)
    if resume and (out / rundir.MODEL_MARKER).is_file() and (run_dir / "config.yaml").is_file():
        print(f"the SFT run in {run_dir} has finished: its model is {out}; nothing to do")
        return out
    rundir.check_model_out(out, overwrite=overwrite)
    # out may live inside run_dir (the default: runs/sft/model): it is the run's own entry.
    inside = out.resolve().parent == run_dir.resolve()
    lock = rundir.prepare_run_dir(run_dir, resume=resume, overwrite=overwrite,
                                  extra_entries=[out.name] if inside else [],
                                  resume_needs_run=resume)
    try:
        return _sft(cfg, run_dir, out, resume, allow_config_change)
    finally:
        lock.release()


@dataclasses.dataclass
class _SFTState:
    """What an SFT checkpoint holds besides the weights: enough to go on exactly."""

    step: int
    optimizer: dict
    scheduler: dict
    data_order: object   # random.Random's state: which demonstrations each step draws
    rng: dict            # torch's and numpy's generators (runtime.checkpoint.rng_state)


def _save_checkpoint(run_dir: Path, step: int, model, tokenizer, optimizer, scheduler,
                     data_order: random.Random, cfg: SFTConfig) -> None:
    with ckpt.atomic_dir(ckpt.checkpoint_path(run_dir, step)) as tmp:
        lora.save_weights(model, tokenizer, tmp)
        state = _SFTState(step, optimizer.state_dict(), scheduler.state_dict(),
                          data_order.getstate(), ckpt.rng_state())
        # vars(), not dataclasses.asdict: asdict deep-copies every optimiser tensor
        torch.save(vars(state), tmp / "trainer_state.pt")
    # The newest `keep` resumable checkpoints; the save_every snapshots are all kept.
    def snapshot(path: Path) -> bool:
        return bool(cfg.save_every) and ckpt.checkpoint_step(path) % cfg.save_every == 0

    prunable = [p for p in ckpt.list_checkpoints(run_dir) if not snapshot(p)]
    for old in prunable[:-cfg.checkpoint.keep]:
        shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(path: Path, model, optimizer, scheduler, data_order: random.Random) -> int:
    state = _SFTState(**torch.load(path / "trainer_state.pt", weights_only=False))
    if lora.is_lora(model):
        lora.load_adapter(model, path)
    else:
        saved, _ = load_model(path)
        model.load_state_dict(saved.state_dict())
    optimizer.load_state_dict(state.optimizer)
    scheduler.load_state_dict(state.scheduler)
    data_order.setstate(state.data_order)
    ckpt.set_rng_state(state.rng)
    return state.step


def _sft(cfg: SFTConfig, run_dir: Path, out: Path, resume: bool = False,
         allow_config_change: bool = False) -> Path:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.init_preset is not None:
        model, tokenizer = build_tiny_model(cfg.init_preset, seed=cfg.seed)
    else:
        model, tokenizer = load_model(cfg.model.path, cfg.model.dtype)
    device = resolve_device(cfg.device)
    model.to(device)
    precision = resolve_compute_dtype(cfg.compute_dtype, device, precision_workload(model))
    print(precision.describe())
    settings = cfg.model.lora if cfg.model is not None else None
    if settings is not None:
        model = lora.apply_lora(model, settings, cfg.seed)
    pairs = build_demonstrations(cfg, tokenizer)
    optimizer = adamw([p for p in model.parameters() if p.requires_grad],
                      lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))

    def schedule(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    rng = random.Random(cfg.seed)
    done = 0
    if resume:
        found = ckpt.load_latest_usable(run_dir, lambda path: _load_checkpoint(
            path, model, optimizer, scheduler, rng))
        if found is not None:
            done = found[1]
            rundir.check_resume_config(run_dir, cfg, done=done, length_key="steps",
                                       free_fields=SFT_RESUME_FREE_FIELDS,
                                       allow_change=allow_config_change)
    dump_config(cfg, run_dir / "config.yaml")
    resume_step = done if resume else None
    logger = MetricsLogger(run_dir, tensorboard=cfg.tensorboard, resume_step=resume_step,
                           trackers=open_trackers(cfg.logging, run_dir, config_to_dict(cfg),
                                                  resume_step))
    progress = StepProgress(cfg.steps, f"sft {cfg.task.name}", enabled=cfg.progress,
                            completed=done, fields=("loss", "tok/s"))
    weight = demonstration_weight(cfg)
    model.train()
    try:
        for step in range(done + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            chosen = rng.sample(pairs, min(cfg.batch_size, len(pairs)))
            with compute_context(device, precision.name):
                if cfg.pack:
                    logp, mask = packed_target_logprobs(model, chosen, tokenizer.pad_token_id,
                                                        device)
                else:
                    ids, attention, labels = (t.to(device) for t in
                                              collate(chosen, tokenizer.pad_token_id))
                    logp, mask = target_logprobs(model, ids, attention, labels)
            loss, metrics = imitation.demonstration_loss(logp, mask, weight=weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            tokens = int(mask.sum())
            row = logger.log(step, {**{f"sft/{k}": v for k, v in metrics.items()},
                                    "sft/lr": scheduler.get_last_lr()[0],
                                    "sft/target_tokens": tokens,
                                    "sft/prompt_tokens": sum(len(p) for p, _ in chosen),
                                    "throughput/tokens_per_s": tokens / (time.perf_counter() - t0),
                                    **precision.metrics()})
            progress.update(step, {"loss": row["sft/loss"], "tok/s": row["throughput/tokens_per_s"]})
            every = [n for n in (cfg.save_every, cfg.checkpoint.every) if n]
            if step < cfg.steps and any(step % n == 0 for n in every):
                _save_checkpoint(run_dir, step, model, tokenizer, optimizer, scheduler, rng, cfg)
    finally:
        progress.close()
        logger.close()
    with ckpt.atomic_dir(out) as tmp:
        lora.save_trained(model, tokenizer, tmp, settings)
    return out
