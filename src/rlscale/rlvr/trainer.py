"""Log-probs of completions under a model, and the policy-gradient update of one step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..runtime.device import compute_context
from ..runtime.optim import adamw
from . import imitation, lora, objectives
from .layout import sequence_lengths
from .logprobs import completion_logprobs

if TYPE_CHECKING:
    from .config import RLVRConfig


@dataclass
class PolicyBatch:
    """One collected step, ready for the update: prompts left-padded, completions right-padded."""

    input_ids: torch.Tensor        # [B, P + T]
    attention_mask: torch.Tensor   # [B, P + T]
    prompt_width: int              # P
    completion_ids: torch.Tensor   # [B, T]
    mask: torch.Tensor             # [B, T]
    advantages: torch.Tensor       # [B], the verifier's (group-relative) sequence advantages
    sampler_logprobs: torch.Tensor  # [B, T]
    policy_version: int            # the oldest version that drew any token
    token_versions: torch.Tensor | None = None  # [B, T]; None: every token `policy_version`
    teacher_logprobs: torch.Tensor | None = None  # [B, T]; a teacher's, for distillation

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, index: torch.Tensor) -> PolicyBatch:
        return PolicyBatch(self.input_ids[index], self.attention_mask[index], self.prompt_width,
                           self.completion_ids[index], self.mask[index], self.advantages[index],
                           self.sampler_logprobs[index], self.policy_version,
                           None if self.token_versions is None else self.token_versions[index],
                           None if self.teacher_logprobs is None else self.teacher_logprobs[index])

    def versions(self) -> torch.Tensor:
        if self.token_versions is not None:
            return self.token_versions
        return torch.full(self.mask.shape, self.policy_version, dtype=torch.long,
                          device=self.mask.device)

    def lengths(self) -> torch.Tensor:
        """[B] prompt + completion tokens of each sequence."""
        prompt, completion = sequence_lengths(self.attention_mask, self.prompt_width,
                                              self.attention_mask[:, self.prompt_width:])
        return (prompt + completion).cpu()

    def to(self, device: torch.device) -> PolicyBatch:
        if self.input_ids.device == device:
            return self

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return PolicyBatch(move(self.input_ids), move(self.attention_mask), self.prompt_width,
                           move(self.completion_ids), move(self.mask), move(self.advantages),
                           move(self.sampler_logprobs), self.policy_version,
                           move(self.token_versions), move(self.teacher_logprobs))


def build_policy_batch(prompt_ids: list[list[int]], completion_ids: torch.Tensor,
                       mask: torch.Tensor, advantages: torch.Tensor,
                       sampler_logprobs: torch.Tensor, pad_token_id: int,
                       policy_version: int, token_versions: torch.Tensor | None = None,
                       tool_mask: torch.Tensor | None = None) -> PolicyBatch:
    """`mask` marks the completion tokens (attended to); `tool_mask` the ones among them a
    tool wrote, which stay in the context and out of the loss: the batch's `mask` is the
    loss mask, the sampled tokens only."""
    batch, width = len(prompt_ids), max(len(p) for p in prompt_ids)
    prompts = torch.full((batch, width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((batch, width), dtype=torch.long)
    for i, ids in enumerate(prompt_ids):
        prompts[i, width - len(ids):] = torch.tensor(ids)
        prompt_mask[i, width - len(ids):] = 1
    return PolicyBatch(
        input_ids=torch.cat([prompts, completion_ids], 1),
        attention_mask=torch.cat([prompt_mask, mask.long()], 1),
        prompt_width=width, completion_ids=completion_ids,
        mask=mask.float() if tool_mask is None else mask.float() * (1 - tool_mask.float()),
        advantages=advantages.float(), sampler_logprobs=sampler_logprobs.float(),
        policy_version=policy_version, token_versions=token_versions)


def micro_batches(index: torch.Tensor, lengths: torch.Tensor, rows: int = 0,
                  tokens: int = 0) -> list[torch.Tensor]:
    """Consecutive groups of `index` (a minibatch's sequence order) of at most `rows`
    sequences and, with `tokens`, at most that many prompt + completion tokens (a longer
    sequence forms a group alone); 0 = no limit of that kind. Memory limits only: the loss
    is normalised by the whole minibatch, so the grouping never changes the math."""
    if tokens <= 0:
        return list(index.split(rows)) if rows > 0 else [index]
    groups, current, used = [], [], 0
    for k, n in zip(index.tolist(), lengths[index].tolist(), strict=True):
        if current and (used + n > tokens or (rows > 0 and len(current) >= rows)):
            groups.append(current)
            current, used = [], 0
        current.append(k)
        used += n
    if current:
        groups.append(current)
    return [torch.tensor(g, dtype=torch.long) for g in groups]


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a minibatch with what its loss reads besides the forward: `rows`
    (into the step's batch), `mask` (the tokens that get the gradient: the top-rho entropy
    tokens of the whole minibatch with loss.entropy_top_rho < 1, else every completion
    token) and the minibatch's counts that every aggregation divides by."""

    rows: torch.Tensor
    batch: PolicyBatch
    mask: torch.Tensor
    num_sequences: int
    num_tokens: float


def minibatch_parts(batch: PolicyBatch, index: torch.Tensor, chunks: list[torch.Tensor],
                    top_entropy: torch.Tensor | None) -> list[MicroBatch]:
    """The micro-batches `chunks` (consecutive pieces of `index`) of the minibatch `index`;
    `top_entropy` is its loss mask in `index` order (None: the completion mask)."""
    num_tokens = float(batch.mask[index].sum())
    parts, offset = [], 0
    for rows in chunks:
        micro = batch.select(rows)
        mask = micro.mask if top_entropy is None else top_entropy[offset: offset + len(rows)]
        offset += len(rows)
        parts.append(MicroBatch(rows, micro, mask, len(index), num_tokens))
    return parts


def loss_inputs(part: MicroBatch, logp: torch.Tensor, old_logp: torch.Tensor,
                ref_logp: torch.Tensor | None,
                objective: objectives.Objective) -> objectives.LossInputs:
    """The loss's inputs of one micro-batch, given its forward (`logp`) and pi_old.

    The advantages are imitation.mixed_advantages: the weighted sequence ones, plus with a
    teacher its per-token ones against pi_old, the trainer's own log-probs of the sampled
    tokens (not the sampler's: a teacher equal to the student then gives exactly 0, where
    engine rounding would leave noise that Adam scales up). With one update per step pi_old
    is this very forward, so the teacher term is formed after it."""
    micro = part.batch
    token = (None if micro.teacher_logprobs is None else
             imitation.teacher_advantages(old_logp, micro.teacher_logprobs, micro.mask))
    advantages = imitation.mixed_advantages(micro.advantages, token,
                                             reward_weight=objective.reward_weight,
                                             teacher_weight=objective.teacher_weight)
    return objectives.LossInputs(logp, old_logp, advantages, part.mask,
                                 behaviour_logp=micro.sampler_logprobs, ref_logp=ref_logp,
                                 num_sequences=part.num_sequences, num_tokens=part.num_tokens)


@dataclass(frozen=True)
class StepResult:
    """What one `PolicyTrainer.step` reports: its metrics, and the state of the policy it
    started from, on the step's own tokens, for `update_stats`."""

    metrics: dict[str, float]
    logp_before: torch.Tensor     # [B, T] pi_old, the log-probs the update started from
    entropy_before: torch.Tensor  # [B, T] token entropies of the first epoch's forwards


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the rows (micro-batches) where it is a finite float, named
    `loss/<key>` where the key has no section."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and math.isfinite(v):
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
    return {(k if "/" in k else f"loss/{k}"): sums[k] / counts[k] for k in sums}


class PolicyTrainer:
    """The learner side of RLVR: owns the trainable model, the reference and the optimiser."""

    @classmethod
    def for_run(cls, model, reference, objective: objectives.Objective, cfg: RLVRConfig,
                compute_dtype: str) -> PolicyTrainer:
        """The trainer of a run of `cfg` (its `train.*` and sampling temperature)."""
        t = cfg.train
        return cls(model, reference, objective, lr=t.lr, weight_decay=t.weight_decay,
                   warmup_steps=t.warmup_steps, grad_clip=t.grad_clip,
                   minibatches=t.minibatches, epochs=t.epochs,
                   micro_batch_size=t.micro_batch_size, temperature=cfg.rollout.temperature,
                   micro_batch_tokens=t.micro_batch_tokens, pack=t.pack,
                   compute_dtype=compute_dtype, compile_update=t.compile)

    def __init__(self, model, reference, objective: objectives.Objective, *, lr: float,
                 weight_decay: float, warmup_steps: int, grad_clip: float, minibatches: int,
                 epochs: int, micro_batch_size: int, temperature: float,
                 micro_batch_tokens: int = 0, pack: bool = False,
                 compute_dtype: str = "float32",  # resolved: float32 | bfloat16
                 compile_update: bool = False) -> None:
        self.model, self.reference, self.objective = model, reference, objective
        # The update's differentiated forward through a compiled decoder (one graph for every
        # packed shape); the no-grad forwards (pi_old, the reference) stay eager, so grad mode
        # never asks for a second compilation. Same loss, gradients to ~1e-8.
        self.update_decoder = (torch.compile(model.get_decoder(), dynamic=True)
                               if compile_update else None)
        self.grad_clip, self.minibatches, self.epochs = grad_clip, minibatches, epochs
        self.micro_batch_size, self.micro_batch_tokens = micro_batch_size, micro_batch_tokens
        self.temperature, self.pack = temperature, pack
        self.device = next(model.parameters()).device
        self.compute_dtype = compute_dtype
        # With LoRA only the adapters train: the optimiser holds what requires a gradient.
        self.optimizer = adamw([p for p in model.parameters() if p.requires_grad],
                               lr=lr, weight_decay=weight_decay, betas=(0.9, 0.99))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps else 1.0)
        self.version = 0  # bumped after every step's updates: the policy version
        self.skipped_updates = 0  # optimiser updates skipped for a non-finite gradient

    # -- helpers -------------------------------------------------------------------------
    def _autocast(self):
        """bf16 matmuls with fp32 master weights (`train.compute_dtype: bfloat16`)."""
        return compute_context(self.device, self.compute_dtype)

    def _micro_batches(self, index: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        return micro_batches(index, lengths, self.micro_batch_size, self.micro_batch_tokens)

    def _logprobs(self, model, batch: PolicyBatch, with_entropy: bool = False, decoder=None):
        with self._autocast():
            return completion_logprobs(model, batch, self.temperature, with_entropy, self.pack,
                                       decoder)

    @torch.no_grad()
    def score_logprobs(self, model, batch: PolicyBatch) -> torch.Tensor:
        """`[B, T]` log-probs of the batch's completion tokens under `model` (pi_old, the
        reference, a teacher), without gradients, in micro-batches, at the sampling temperature."""
        batch = batch.to(self.device)
        return torch.cat([self._logprobs(model, batch.select(idx))[0]
                          for idx in self._micro_batches(torch.arange(len(batch)), batch.lengths())])

    def reference_logprobs(self, batch: PolicyBatch) -> torch.Tensor | None:
        """The reference policy's log-probs: a separate model, or with LoRA the base model
        (the trained model with its adapters disabled); None when there is neither."""
        if self.reference is not None:
            return self.score_logprobs(self.reference, batch)
        if lora.is_lora(self.model):
            with self.model.disable_adapter():
                return self.score_logprobs(self.model, batch)
        return None

    @torch.no_grad()
    def _top_entropy_rows(self, minibatch: PolicyBatch, rho: float) -> torch.Tensor:
        """The top-rho entropy tokens of the whole minibatch (not of each micro-batch, so
        the micro-batch size never changes which tokens get the gradient)."""
        entropy = torch.cat([
            self._logprobs(self.model, minibatch.select(idx), with_entropy=True)[1]
            for idx in self._micro_batches(torch.arange(len(minibatch)), minibatch.lengths())])
        return objectives.top_entropy_mask(entropy, minibatch.mask, rho)

    def _minibatch(self, batch: PolicyBatch, index: torch.Tensor,
                   lengths: torch.Tensor) -> list[MicroBatch]:
        rho = self.objective.entropy_top_rho
        top_entropy = self._top_entropy_rows(batch.select(index), rho) if rho < 1.0 else None
        return minibatch_parts(batch, index, self._micro_batches(index, lengths), top_entropy)

    def _optimizer_step(self) -> float:
        """Clip the accumulated gradient and step; a non-finite one is skipped (it would
        poison the weights). Returns the gradient norm."""
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
        if math.isfinite(norm):
            self.optimizer.step()
        else:
            self.skipped_updates += 1
        self.scheduler.step()
        return norm

    # -- the update ----------------------------------------------------------------------
    def step(self, batch: PolicyBatch, generator: torch.Generator | None = None) -> StepResult:
        self.model.train()
        batch = batch.to(self.device)
        lengths = batch.lengths()
        # pi_old is the trainer's own recomputation in its own dtype, whoever sampled the batch
        # (the engine's mu may come from other weights, another dtype or process). With one
        # update per batch the weights being trained ARE pi_old: its log-probs are the forward
        # we run anyway, detached; a separate pass would recompute the same numbers.
        single_pass = self.epochs * self.minibatches == 1
        old_logp = None if single_pass else self.score_logprobs(self.model, batch)
        ref_logp = self.reference_logprobs(batch) if self.objective.kl_coef > 0 else None

        loss_metrics, entropies, grad_norms = [], [], []
        logp_first = torch.zeros_like(batch.mask)
        entropy_first = torch.zeros_like(batch.mask)
        for epoch in range(self.epochs):
            order = torch.randperm(len(batch), generator=generator)
            for mb_index in order.tensor_split(self.minibatches):
                if len(mb_index) == 0:
                    continue
                parts = self._minibatch(batch, mb_index, lengths)
                self.optimizer.zero_grad(set_to_none=True)
                for part in parts:
                    idx, micro = part.rows, part.batch
                    logp, entropy = self._logprobs(self.model, micro, with_entropy=True,
                                                   decoder=self.update_decoder)
                    micro_old = logp.detach() if old_logp is None else old_logp[idx]
                    out = objectives.policy_loss(
                        loss_inputs(part, logp, micro_old,
                                    None if ref_logp is None else ref_logp[idx], self.objective),
                        self.objective)
                    out.loss.backward()
                    if epoch == 0:
                        logp_first[idx], entropy_first[idx] = logp.detach(), entropy
                    entropies.append((float((entropy * micro.mask).sum()),
                                      float(micro.mask.sum())))
                    loss_metrics.append(out.metrics.as_dict())
                grad_norms.append(self._optimizer_step())
        self.version += 1
        logp_before = logp_first if old_logp is None else old_logp
        metrics = mean_metrics(loss_metrics)
        lag = (self.version - 1) - batch.versions()  # versions behind the weights trained
        metrics.update(objectives.behaviour_mismatch(logp_before, batch.sampler_logprobs,
                                                     batch.mask, lag))
        ent_sum = sum(e for e, _ in entropies)
        ent_n = sum(n for _, n in entropies)
        metrics["policy/entropy"] = ent_sum / max(ent_n, 1.0)
        metrics["policy/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        metrics["policy/grad_norm_max"] = max(grad_norms, default=0.0)
        metrics["policy/lr"] = self.scheduler.get_last_lr()[0]
        metrics["policy/old_logp_forward_skipped"] = float(single_pass)
        if batch.teacher_logprobs is not None:
            metrics["opd/reverse_kl"] = imitation.reverse_kl_per_token(
                logp_before, batch.teacher_logprobs, batch.mask)
        return StepResult(metrics, logp_before, entropy_first)

    @torch.no_grad()
    def update_stats(self, batch: PolicyBatch, before: StepResult) -> dict[str, float]:
        """How far the step that returned `before` moved the policy on its own samples
        (`batch`), and where it moved it."""
        logp_before, entropy_before = before.logp_before, before.entropy_before
        batch = batch.to(self.device)
        self.model.eval()
        logp_after = self.score_logprobs(self.model, batch)
        mask = batch.mask
        n = float(mask.sum().clamp(min=1))
        # KL(old || new) estimated on tokens sampled from old (k3, non-negative): old is the
        # policy the samples came from, so it takes k3's policy slot (ratio new/old). The
        # other way round (ratio old/new) adds a chi-square term that explodes on any
        # token whose probability the step pushed towards 0.
        kl = objectives.kl_penalty(logp_before, logp_after, "k3")
        change = (logp_after - logp_before).abs() * mask
        top = objectives.top_entropy_mask(entropy_before, mask, 0.2)
        total_change = float(change.sum())
        stats = {
            "policy/kl_new_old": float((kl * mask).sum()) / n,
            "policy/logp_change_mean": total_change / n,
            "policy/update_share_top20_entropy": (float((change * top).sum()) / total_change
                                                  if total_change > 0 else 0.0),
            "policy/top20_entropy_token_share": float(top.sum()) / n,
        }
        ref_logp = self.reference_logprobs(batch)
        if ref_logp is not None:  # how far the policy that sampled these is from the start
            to_ref = objectives.kl_penalty(logp_before, ref_logp, "k3")
            stats["kl/reference"] = float((to_ref * mask).sum()) / n
        return stats
