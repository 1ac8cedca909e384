"""PPO's learned critic: a value model, GAE advantages per token, and the clipped value loss.

GRPO's baseline is the mean reward of the prompt's group; PPO's (Schulman et al. 2017, as
RLHF uses it: Ouyang et al. 2022, and TRL's, verl's and OpenRLHF's PPO trainers) is a value
function `V(s_t)`, the expected reward from the state before token `t`, trained by
regression to the returns it is meant to predict. The verifier rewards only the last token,

    r_t = R at the completion's last sampled token, 0 before it,

and generalised advantage estimation (GAE, Schulman et al. 2016) spreads it back:

    delta_t = r_t + gamma V(s_{t+1}) - V(s_t)          (V after the last token is 0)
    A_t     = sum_l (gamma lambda)^l delta_{t+l}        returns_t = A_t + V(s_t)

With lambda = 1 and gamma = 1, `A_t = R - V(s_t)`: the critic is a per-token baseline, and
all the credit assignment it can do rests on how well V predicts R from a prefix. That is
what the field's move to GRPO questions (a critic the size of the policy, trained on one
sparse bit per trace); `rlscale experiments run ppo_critic` measures it.

The value model is a copy of the policy's decoder with a scalar head (zero-initialised: it
starts by predicting 0), its own AdamW, trained after each policy step on the step's batch
for the same epochs and minibatches, by the clipped value loss

    L_V = 1/2 agg max((V - G)^2, (V_old + clip(V - V_old, -eps, eps) - G)^2)

(PPO's value clipping: a minibatch cannot move a value further than `eps` from where the
step started, unless that brings it closer to its return).

In a learner group (train.learner_processes > 1) every rank holds an FSDP2 shard of the
value model and computes its share of each minibatch's rows, as the policy's trainer does
(rlvr/ranks.py): the values every rank's rows put together, the loss normalised by the whole
minibatch's tokens, the gradients summed over the ranks. N processes fit what one fits.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..runtime.device import compute_context
from ..runtime.optim import adamw
from .attention import training_attention
from .batch import PolicyBatch, micro_batches
from .logprobs import make_layout
from .lora import is_lora
from .objectives import Aggregation, Objective
from .ranks import RankGroup
from .token_math import masked_mean, positive

# ----------------------------------------------------------------------------- the math


def terminal_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """`[B, T]` per-token rewards: each row's `[B]` reward on its last token of `mask` (the
    last sampled token), 0 elsewhere; a row without tokens gets none."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards[rows].float()
    return out


def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float,
        lam: float) -> tuple[Tensor, Tensor]:
    """`(advantages, returns)`, both `[B, T]` and 0 outside `mask`, by GAE(gamma, lambda)
    over each row's masked tokens in order. Tokens outside the mask (padding, or text a tool
    wrote) are not steps: the recursion passes over them, as the environment's part of the
    transition."""
    rewards, values, mask = token_rewards.float(), values.detach().float(), mask > 0
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])      # A_{t+1}
    next_value = torch.zeros_like(values[:, 0])   # V(s_{t+1}); 0 after the last token
    for t in reversed(range(values.shape[1])):
        here = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        advantages[:, t] = torch.where(here, step, torch.zeros_like(step))
        running = torch.where(here, step, running)
        next_value = torch.where(here, values[:, t], next_value)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns


def whiten(advantages: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Advantages standardised over the batch's masked tokens (mean 0, std 1), 0 outside:
    what PPO implementations do before the policy loss, so the step size does not follow
    the reward's scale."""
    mean = masked_mean(advantages, mask)
    centred = (advantages - mean) * mask
    variance = (centred ** 2).sum() / positive(mask.sum() - 1)
    return centred / (variance.sqrt() + eps)


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *,
               clip: float, aggregate: Aggregation) -> tuple[Tensor, Tensor]:
    """PPO's clipped value loss (to minimise) and the share of tokens whose clipped term was
    the larger one (where clipping bit). `clip` 0 or less: no clipping."""
    error = (values - returns) ** 2
    if clip <= 0:
        return 0.5 * aggregate(error, mask), torch.zeros((), device=values.device)
    old_values = old_values.detach()
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    clipped_error = (clipped - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(error, clipped_error), mask)
    bit = masked_mean((clipped_error > error).float(), mask).detach()
    return loss, bit


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """`1 - Var(G - V) / Var(G)` over the masked tokens: 1 for a perfect critic, 0 for one
    no better than a constant, negative for a worse one (nan when the returns are constant)."""
    residual = masked_mean((returns - values) ** 2, mask) - masked_mean(returns - values, mask) ** 2
    spread = masked_mean(returns ** 2, mask) - masked_mean(returns, mask) ** 2
    return float(1 - residual / spread) if float(spread) > 0 else math.nan


# ----------------------------------------------------------------------------- the model


class ValueModel(nn.Module):
    """The policy's decoder (a copy, trained on its own) with a scalar head on its last
    hidden state. A LoRA policy's critic trains as the policy does: its own copy of the
    adapters (from the policy's) over the frozen base, and the head, as OpenRLHF's LoRA
    critic does; a full policy's critic trains every weight."""

    def __init__(self, policy) -> None:
        super().__init__()
        self.trunk = copy.deepcopy(policy.get_decoder())
        if not is_lora(policy):
            self.trunk.requires_grad_(True)
        hidden = policy.config.hidden_size
        parameter = next(self.trunk.parameters())
        self.head = nn.Linear(hidden, 1, dtype=parameter.dtype, device=parameter.device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, batch: PolicyBatch, pack: bool = False) -> Tensor:
        """`[B, T]` values of the states before each completion token (0 on padding)."""
        layout = make_layout(batch, pack)
        with training_attention(self.trunk):
            hidden = self.trunk(input_ids=layout.input_ids, attention_mask=layout.attention_mask,
                                position_ids=layout.position_ids,
                                use_cache=False).last_hidden_state
        picked = self.head(hidden[layout.logit_index]).squeeze(-1).float()
        values = torch.zeros(batch.completion_ids.shape, dtype=picked.dtype,
                             device=picked.device)
        return values.index_put(layout.token_index, picked)


@dataclass(frozen=True)
class CriticTargets:
    """What a step's critic update regresses to: the values it started from and the
    returns, both `[B, T]` over the step's batch."""

    old_values: Tensor
    returns: Tensor


class Critic:
    """The value model with its optimiser, trained on the same epochs x minibatches as the
    policy (and the same micro-batches: memory limits only)."""

    def __init__(self, policy, *, lr: float, weight_decay: float, grad_clip: float,
                 value_clip: float, epochs: int, minibatches: int, micro_batch_size: int = 0,
                 micro_batch_tokens: int = 0, pack: bool = False,
                 compute_dtype: str = "float32", ranks: RankGroup | None = None) -> None:
        """`policy`: the (unsharded) model whose decoder the value model copies; `ranks`: this
        process's place in a learner group, whose value model is sharded over it."""
        self.ranks = ranks or RankGroup()
        self.model = ValueModel(policy)
        self.device = next(self.model.parameters()).device
        if self.ranks.distributed:
            from .sharding import shard_value_model

            self.model = shard_value_model(self.model, self.device.type)
        self.optimizer = adamw([p for p in self.model.parameters() if p.requires_grad], lr=lr,
                               weight_decay=weight_decay, betas=(0.9, 0.99))
        self.grad_clip, self.value_clip = grad_clip, value_clip
        self.epochs, self.minibatches = epochs, minibatches
        self.micro_batch_size, self.micro_batch_tokens = micro_batch_size, micro_batch_tokens
        self.pack, self.compute_dtype = pack, compute_dtype

    def _forward(self, batch: PolicyBatch) -> Tensor:
        with compute_context(self.device, self.compute_dtype):
            return self.model(batch, self.pack)

    def _chunks(self, index: Tensor, lengths: Tensor) -> list[Tensor]:
        return micro_batches(index, lengths, self.micro_batch_size, self.micro_batch_tokens)

    def _my_chunks(self, index: Tensor, lengths: Tensor) -> list[Tensor | None]:
        """This rank's micro-batches of the rows `index`, padded with None to as many as any
        rank runs (each forward of a sharded model is a collective)."""
        start, end = self.ranks.share(index, lengths)
        mine = self._chunks(index[start:end], lengths) if end > start else []
        return self.ranks.padded(mine)

    def _padding(self, batch: PolicyBatch) -> Tensor:
        """A forward that counts for nothing, for a rank with fewer micro-batches."""
        return self._forward(batch.select(torch.arange(1)))

    @torch.no_grad()
    def values(self, batch: PolicyBatch) -> Tensor:
        """`[B, T]` values of every row of `batch`, in micro-batches, without gradients (in a
        group: each rank's rows, put together on every rank)."""
        self.model.eval()
        out = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)
        for chunk in self._my_chunks(torch.arange(len(batch)), batch.lengths()):
            if chunk is None:
                self._padding(batch)
                continue
            out[chunk] = self._forward(batch.select(chunk)).to(out.device)
        reshard = getattr(self.model, "reshard", None)  # no backward follows (sharding.py)
        if reshard is not None:
            reshard()
        return self.ranks.sum(out)

    def fit(self, batch: PolicyBatch, targets: CriticTargets,
            generator: torch.Generator | None = None) -> dict[str, float]:
        """Regress the values of `batch` to `targets.returns`, epochs x minibatches, each
        minibatch's loss normalised by its whole token count (token mean)."""
        self.model.train()
        lengths = batch.lengths()
        losses, clipped, norms = [], [], []
        for _ in range(self.epochs):
            order = torch.randperm(len(batch), generator=generator)
            for index in order.tensor_split(self.minibatches):
                if len(index) == 0:
                    continue
                aggregate = Aggregation("token-mean", num_tokens=float(batch.mask[index].sum()))
                self.optimizer.zero_grad(set_to_none=True)
                sums = torch.zeros(2, dtype=torch.float64)  # this rank's loss, clipped tokens
                for chunk in self._my_chunks(index, lengths):
                    if chunk is None:
                        (self._padding(batch).sum() * 0.0).backward()
                        continue
                    micro = batch.select(chunk)
                    loss, share = value_loss(self._forward(micro), targets.old_values[chunk],
                                             targets.returns[chunk], micro.mask,
                                             clip=self.value_clip, aggregate=aggregate)
                    loss.backward()
                    sums += torch.tensor([float(loss.detach()),
                                          float(share) * float(micro.mask.sum())],
                                         dtype=torch.float64)
                total, bit = self.ranks.sum(sums).tolist()
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
                norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
                if math.isfinite(norm):
                    self.optimizer.step()
                losses.append(total)
                clipped.append(bit / max(aggregate.num_tokens, 1.0))
                norms.append(norm)
        return {"critic/value_loss": sum(losses) / max(len(losses), 1),
                "critic/value_clip_fraction": sum(clipped) / max(len(clipped), 1),
                "critic/grad_norm": sum(norms) / max(len(norms), 1)}

    def state(self) -> dict:
        """One process's critic: its weights and optimiser state (as trainer_state.pt keeps
        them)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def make_critic(objective: Objective, train, policy, compute_dtype: str,
                ranks: RankGroup | None = None) -> Critic | None:
    """PPO's value model (objective `critic`), a copy of `policy`'s decoder, with the
    policy's optimiser settings and batch shape (`train`: a TrainConfig), sharded over
    `ranks` in a learner group; None for the critic-free objectives."""
    if not objective.critic:
        return None
    return Critic(policy, lr=objective.critic_lr or train.lr, weight_decay=train.weight_decay,
                  grad_clip=train.grad_clip, value_clip=objective.value_clip,
                  epochs=train.epochs, minibatches=train.minibatches,
                  micro_batch_size=train.micro_batch_size,
                  micro_batch_tokens=train.micro_batch_tokens, pack=train.pack,
                  compute_dtype=compute_dtype, ranks=ranks)


# ----------------------------------------------------------------------------- a step's advantages


def position_thirds(mask: Tensor) -> list[Tensor]:
    """Three `[B, T]` masks: each row's sampled tokens in the first, middle and last third
    of its completion (by their order among the row's sampled tokens)."""
    order = mask.cumsum(dim=1) - 1                       # 0-based index among sampled tokens
    length = mask.sum(dim=1, keepdim=True).clamp(min=1)
    third = (order * 3 // length).clamp(max=2)
    return [mask * (third == k) for k in range(3)]


def value_figures(values: Tensor, rewards: Tensor, mask: Tensor,
                  returns: Tensor) -> dict[str, float]:
    """How well the critic predicted this batch before its update: explained variance of
    the returns, and its mean absolute error against the trace's own reward (the Monte-Carlo
    return at gamma 1) at the start, middle and end of the traces."""
    figures = {"critic/explained_variance": explained_variance(values, returns, mask),
               "critic/value_mean": float(masked_mean(values, mask)),
               "critic/return_mean": float(masked_mean(returns, mask))}
    error = (values - rewards[:, None]).abs()
    for name, part in zip(("first", "middle", "last"), position_thirds(mask), strict=True):
        figures[f"critic/value_error_{name}_third"] = float(masked_mean(error, part))
    return figures


def critic_advantages(critic: Critic, batch: PolicyBatch, *, gamma: float, lam: float,
                      whiten_advantages: bool) -> tuple[PolicyBatch, CriticTargets,
                                                        dict[str, float]]:
    """The step's batch with per-token GAE advantages in place of its rewards (the batch's
    `[B]` advantages, passed through by the `reward` estimator), the critic's regression
    targets, and how well it predicted them."""
    rewards, mask = batch.advantages.float(), batch.mask
    values = critic.values(batch)
    advantages, returns = gae(terminal_rewards(rewards, mask), values, mask, gamma=gamma,
                              lam=lam)
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    return (dataclasses.replace(batch, advantages=advantages), CriticTargets(values, returns),
            value_figures(values, rewards, mask, returns))
