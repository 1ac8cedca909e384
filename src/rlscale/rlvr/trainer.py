"""The learner of RLVR: forward, loss, backward and optimiser step over a step's batch.

Algorithm-blind: what the loss asks of a step (a reference forward, the tokens that get
the gradient, the loss's inputs, the loss, its extra figures) comes through a `StepLoss`
(step_loss.py); the advantages arrive finished in the batch (advantages.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..runtime.device import compute_context
from ..runtime.optim import adamw
from . import lora
from .batch import MicroBatch, PolicyBatch, micro_batches, minibatch_parts
from .logprobs import completion_logprobs
from .loss_metrics import behaviour_mismatch
from .ranks import RankGroup
from .step_loss import StepLoss
from .token_math import kl_penalty, top_entropy_mask

if TYPE_CHECKING:
    from .config import TrainConfig


@dataclass(frozen=True)
class StepResult:
    """What one `PolicyTrainer.step` reports: its metrics, and the state of the policy it
    started from, on the step's own tokens, for `update_stats`."""

    metrics: dict[str, float]
    logp_before: torch.Tensor     # [B, T] pi_old, the log-probs the update started from
    entropy_before: torch.Tensor  # [B, T] token entropies of the first epoch's forwards


# The loss figures a micro-batch holds its share of (each is normalised by the whole
# minibatch's counts): summed over the minibatch's micro-batches, on every rank, they are the
# minibatch's loss, which then averages over the step's minibatches like every other figure.
MINIBATCH_SUMS = ("loss", "loss/policy", "kl/loss")


def _finite(v) -> bool:
    return isinstance(v, float) and math.isfinite(v)


def mean_metrics(rows: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """The step's figures from its micro-batches' `(minibatch, figures)` rows: each one's
    mean over the rows where it is a finite float, the loss figures (MINIBATCH_SUMS)
    summed within each minibatch first; named `loss/<key>` where the key has no section."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    per_minibatch: dict[str, dict[int, float]] = {}
    for minibatch, row in rows:
        for k, v in row.items():
            if not _finite(v):
                continue
            if k in MINIBATCH_SUMS:
                totals = per_minibatch.setdefault(k, {})
                totals[minibatch] = totals.get(minibatch, 0.0) + v
            else:
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
    out = {k: sums[k] / counts[k] for k in sums}
    for k, totals in per_minibatch.items():
        out[k] = sum(totals.values()) / len(totals)
    return {(k if "/" in k else f"loss/{k}"): v for k, v in out.items()}


class PolicyTrainer:
    """The learner side of RLVR: owns the trainable model, the reference and the optimiser.

    In a learner group (`ranks`, rlvr/ranks.py) every process holds one; `model` and
    `reference` are then sharded (rlvr/sharding.py), each process computes its share of
    every minibatch's rows, and the step's results are put together on every rank."""

    def __init__(self, model, reference, loss: StepLoss, train: TrainConfig, *,
                 temperature: float, compute_dtype: str = "float32",
                 ranks: RankGroup | None = None) -> None:
        """`train`: the run's `train:` section; `temperature`: the sampler's (log-probs are
        scored at it); `compute_dtype`: resolved, float32 | bfloat16; `ranks`: this
        process's place in the learner group (None: the only process)."""
        self.model, self.reference, self.loss = model, reference, loss
        self.ranks = ranks or RankGroup()
        # The update's differentiated forward through a compiled decoder (one graph for every
        # packed shape); the no-grad forwards (pi_old, the reference) stay eager, so grad mode
        # never asks for a second compilation. Same loss, gradients to ~1e-8.
        self.update_decoder = (torch.compile(model.get_decoder(), dynamic=True)
                               if train.compile else None)
        self.grad_clip, self.minibatches, self.epochs = train.grad_clip, train.minibatches, train.epochs
        self.micro_batch_size, self.micro_batch_tokens = train.micro_batch_size, train.micro_batch_tokens
        self.temperature, self.pack = temperature, train.pack
        self.device = next(model.parameters()).device
        self.compute_dtype = compute_dtype
        # With LoRA only the adapters train: the optimiser holds what requires a gradient.
        self.optimizer = adamw([p for p in model.parameters() if p.requires_grad],
                               lr=train.lr, weight_decay=train.weight_decay, betas=(0.9, 0.99))
        warmup = train.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
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

    def _my_micro_batches(self, index: torch.Tensor, lengths: torch.Tensor
                          ) -> tuple[int, int, list[torch.Tensor | None]]:
        """This rank's share `[start, end)` of the rows `index` and its micro-batches, padded
        with None to as many as any rank runs."""
        start, end = self.ranks.share(index, lengths)
        mine = self._micro_batches(index[start:end], lengths) if end > start else []
        return start, end, self.ranks.padded(mine)

    @torch.no_grad()
    def _score_rows(self, model, batch: PolicyBatch,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[B, T]` log-probs (and entropies) of every row of `batch`: this rank's rows in
        micro-batches, every rank's put together."""
        start, end, chunks = self._my_micro_batches(torch.arange(len(batch)), batch.lengths())
        logps, entropies = [], []
        for chunk in chunks:
            if chunk is None:  # a padding forward: the others' forwards are collectives
                self._logprobs(model, batch.select(torch.arange(1)))
                continue
            logp, entropy = self._logprobs(model, batch.select(chunk), with_entropy)
            logps.append(logp)
            entropies.append(entropy)
        # An FSDP2 root keeps its gathered weights after a forward until a backward reshards
        # them: with no backward here, shard them again (sharding.py).
        reshard = getattr(model, "reshard", None)
        if reshard is not None:
            reshard()
        shape, rows = tuple(batch.mask.shape), torch.arange(start, end)
        empty = batch.mask.new_zeros((0, shape[1]))
        logp = self.ranks.gather_rows(torch.cat(logps) if logps else empty, rows, shape)
        if not with_entropy:
            return logp, None
        return logp, self.ranks.gather_rows(torch.cat(entropies) if entropies else empty,
                                            rows, shape)

    def score_logprobs(self, model, batch: PolicyBatch) -> torch.Tensor:
        """`[B, T]` log-probs of the batch's completion tokens under `model` (pi_old, the
        reference, another scoring model), without gradients, in micro-batches, at the sampling
        temperature."""
        return self._score_rows(model, batch.to(self.device))[0]

    def reference_logprobs(self, batch: PolicyBatch) -> torch.Tensor | None:
        """The reference policy's log-probs: a separate model, or with LoRA the base model
        (the trained model with its adapters disabled); None when there is neither."""
        if self.reference is not None:
            return self.score_logprobs(self.reference, batch)
        if lora.is_lora(self.model):
            with self.model.disable_adapter():
                return self.score_logprobs(self.model, batch)
        return None

    def _minibatch(self, batch: PolicyBatch, index: torch.Tensor,
                   lengths: torch.Tensor) -> list[MicroBatch | None]:
        """This rank's micro-batches of the minibatch `index` (None: a padding one)."""
        minibatch = batch.select(index)
        mask = self.loss.gradient_mask(
            minibatch.mask, lambda: self._score_rows(self.model, minibatch, with_entropy=True)[1])
        start, end, chunks = self._my_micro_batches(index, lengths)
        parts = iter(minibatch_parts(batch, index, [c for c in chunks if c is not None], mask,
                                     offset=start))
        return [None if chunk is None else next(parts) for chunk in chunks]

    def _padding_backward(self, batch: PolicyBatch) -> None:
        """A forward and backward that add nothing to the gradient, for a rank with fewer
        micro-batches than another (FSDP2 gathers and reduces in every one)."""
        logp, _ = self._logprobs(self.model, batch.select(torch.arange(1)),
                                 decoder=self.update_decoder)
        (logp.sum() * 0.0).backward()

    def _optimizer_step(self) -> float:
        """Clip the accumulated gradient and step; a non-finite one is skipped (it would
        poison the weights). Returns the gradient norm (of every rank's shards together)."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if math.isfinite(norm):
            self.optimizer.step()
        else:
            self.skipped_updates += 1
        self.scheduler.step()
        return norm

    def set_lr(self, lr: float, weight_decay: float) -> None:
        """The config's learning rate and weight decay at the schedule's current position:
        a resumed optimiser state carries the old run's, and a resume with a (recorded)
        change must train with the new ones."""
        sched = self.scheduler
        sched.base_lrs = [lr] * len(sched.base_lrs)
        for group, schedule in zip(self.optimizer.param_groups, sched.lr_lambdas, strict=True):
            group.update(initial_lr=lr, lr=lr * schedule(sched.last_epoch),
                         weight_decay=weight_decay)
        sched._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    # -- the update ----------------------------------------------------------------------
    def step(self, batch: PolicyBatch, generator: torch.Generator | None = None) -> StepResult:
        self.model.train()
        batch, critic_targets, critic_metrics = self.loss.prepare(batch.to(self.device))
        lengths = batch.lengths()
        # pi_old is the trainer's own recomputation in its own dtype, whoever sampled the batch
        # (the engine's mu may come from other weights, another dtype or process). With one
        # update per batch the weights being trained ARE pi_old: its log-probs are the forward
        # we run anyway, detached; a separate pass would recompute the same numbers.
        single_pass = self.epochs * self.minibatches == 1
        old_logp = None if single_pass else self.score_logprobs(self.model, batch)
        ref_logp = self.reference_logprobs(batch) if self.loss.needs_reference else None

        loss_metrics, entropies, grad_norms = [], [], []
        # float32 (float64 for a float64 model: exactness checks), as the forwards give them
        logp_dtype = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)
        logp_first = torch.zeros_like(batch.mask, dtype=logp_dtype)
        entropy_first = torch.zeros_like(batch.mask, dtype=logp_dtype)
        for epoch in range(self.epochs):
            order = torch.randperm(len(batch), generator=generator)
            for minibatch, mb_index in enumerate(order.tensor_split(self.minibatches),
                                                 start=epoch * self.minibatches):
                if len(mb_index) == 0:
                    continue
                parts = self._minibatch(batch, mb_index, lengths)
                self.optimizer.zero_grad(set_to_none=True)
                for part in parts:
                    if part is None:
                        self._padding_backward(batch)
                        continue
                    idx, micro = part.rows, part.batch
                    logp, entropy = self._logprobs(self.model, micro, with_entropy=True,
                                                   decoder=self.update_decoder)
                    micro_old = logp.detach() if old_logp is None else old_logp[idx]
                    out = self.loss(self.loss.inputs(
                        part, logp, micro_old, None if ref_logp is None else ref_logp[idx]))
                    out.loss.backward()
                    if epoch == 0:
                        logp_first[idx], entropy_first[idx] = logp.detach(), entropy
                    entropies.append(((entropy * micro.mask).sum(), micro.mask.sum()))
                    loss_metrics.append((minibatch, out.metrics))  # read at the step's end
                grad_norms.append(self._optimizer_step())
        self.version += 1
        # Every row of epoch 0 was computed by exactly one rank: a sum puts them together.
        logp_first, entropy_first = self.ranks.sum(logp_first), self.ranks.sum(entropy_first)
        logp_before = logp_first if old_logp is None else old_logp
        rows = [(minibatch, m.as_dict()) for minibatch, m in loss_metrics]
        metrics = mean_metrics([row for rank_rows in self.ranks.gather_objects(rows)
                                for row in rank_rows])
        lag = (self.version - 1) - batch.versions()  # versions behind the weights trained
        metrics.update(behaviour_mismatch(logp_before, batch.sampler_logprobs, batch.mask, lag))
        ent_sum, ent_n = self.ranks.sum(torch.tensor(
            [sum(float(e) for e, _ in entropies), sum(float(n) for _, n in entropies)],
            dtype=torch.float64)).tolist()
        metrics["policy/entropy"] = ent_sum / max(ent_n, 1.0)
        metrics["policy/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        metrics["policy/grad_norm_max"] = max(grad_norms, default=0.0)
        metrics["policy/lr"] = self.scheduler.get_last_lr()[0]
        metrics["policy/old_logp_forward_skipped"] = float(single_pass)
        metrics.update(self.loss.step_metrics(batch, logp_before))
        metrics.update(critic_metrics)
        metrics.update(self.loss.finish(batch, critic_targets, generator))
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
        kl = kl_penalty(logp_before, logp_after, "k3")
        change = (logp_after - logp_before).abs() * mask
        top = top_entropy_mask(entropy_before, mask, 0.2)
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
            to_ref = kl_penalty(logp_before, ref_logp, "k3")
            stats["kl/reference"] = float((to_ref * mask).sum()) / n
        return stats
