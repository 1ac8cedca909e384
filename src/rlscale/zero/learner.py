"""The learner: distil the search into the network.

    loss = (v - z)^2  +  cross_entropy(mu, pi)  +  L2
           [+ ownership_weight * ownership loss  +  score_weight * score loss]

v, pi: the network's value and policy; z: the game outcome (optionally mixed with the
search's root value), mu: the search policy. The L2 term is the optimiser's weight decay
(coupled for SGD, as in AlphaZero; decoupled for AdamW). The bracketed terms are KataGo's
auxiliary targets, for a network with those heads, over the samples of played-out games.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..runtime.optim import adamw
from .config import TrainConfig
from .network import NetOutput, PolicyValueNet
from .replay import Samples


def zero_losses(
    logits: torch.Tensor, values: torch.Tensor, policy_target: torch.Tensor,
    value_target: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Per-batch means: value MSE, policy cross-entropy, and the network policy's entropy."""
    log_pi = F.log_softmax(logits, dim=-1)
    value_loss = F.mse_loss(values, value_target)
    policy_loss = -(policy_target * log_pi).sum(-1).mean()
    entropy = -(log_pi.exp() * log_pi).sum(-1).mean()
    return {"value_loss": value_loss, "policy_loss": policy_loss, "policy_entropy": entropy}


def ownership_loss(logits: torch.Tensor, target: torch.Tensor,
                   known: torch.Tensor) -> torch.Tensor:
    """KataGo's ownership loss: per point, the cross-entropy between the final owner (target
    t in {-1, 0, 1}: the player to move owns the point with probability (1 + t) / 2) and the
    head's (1 + tanh(logit)) / 2 = sigmoid(2 logit); averaged over the points, then over the
    samples with `known` final positions (0 when there are none)."""
    per_point = F.binary_cross_entropy_with_logits(2 * logits, (1 + target) / 2,
                                                   reduction="none")
    return _known_mean(per_point.flatten(1).mean(1), known)


def score_loss(predicted: torch.Tensor, target: torch.Tensor,
               known: torch.Tensor) -> torch.Tensor:
    """Squared error of the final score (both in score / board points), over `known`."""
    return _known_mean((predicted - target) ** 2, known)


def _known_mean(per_sample: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    known = known.to(per_sample.dtype)
    return (per_sample * known).sum() / known.sum().clamp(min=1.0)


def final_position_losses(out: NetOutput,
                          batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The losses of the heads `out` has, against `batch`'s final-position fields (ownership
    [B, H, W], score [B] in points, final_known [B]); the score is scaled by the board's
    points."""
    losses = {}
    if out.ownership_logits is not None:
        losses["ownership_loss"] = ownership_loss(
            out.ownership_logits, batch["ownership"], batch["final_known"])
    if out.score is not None:
        points = batch["ownership"][0].numel()
        losses["score_loss"] = score_loss(out.score, batch["score"] / points,
                                          batch["final_known"])
    return losses


class Learner:
    """The network (moved to `device`), its optimizer, and the updates."""

    def __init__(self, net: PolicyValueNet, config: TrainConfig,
                 device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.net = net.to(self.device)  # before the optimizer: its state lives beside them
        self.config = config
        if config.optimizer == "sgd":
            self.optimizer: torch.optim.Optimizer = torch.optim.SGD(
                net.parameters(), lr=config.lr, momentum=config.momentum,
                weight_decay=config.weight_decay,
            )
        else:
            self.optimizer = adamw(net.parameters(), lr=config.lr,
                                   weight_decay=config.weight_decay)
        self.steps = 0

    def lr_at(self, iteration: int) -> float:
        """The learning rate of the config's step schedule at `iteration` (1-based)."""
        lr = self.config.lr
        for start, value in sorted(self.config.lr_steps.items()):
            if iteration >= start:
                lr = value
        return lr

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        """`array` on the learner's device (on the CPU: shares its memory, no copy)."""
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    def step(self, batch: Samples) -> dict[str, float]:
        self.net.train()
        mix = self.config.value_target_mix
        value_target = (1.0 - mix) * batch.outcome + mix * batch.root_value
        out = self.net.outputs(self._tensor(batch.planes))
        losses = zero_losses(
            out.logits, out.value, self._tensor(batch.policy),
            self._tensor(value_target.astype(np.float32)),
        )
        loss = losses["value_loss"] + losses["policy_loss"]
        # A batch with no played-out game has no final-position loss (logged only when there).
        if batch.final_known is not None and batch.final_known.any():
            final = final_position_losses(out, {
                "ownership": self._tensor(batch.ownership.astype(np.float32)),
                "score": self._tensor(batch.score), "final_known": self._tensor(batch.final_known),
            })
            weights = {"ownership_loss": self.config.ownership_weight,
                       "score_loss": self.config.score_weight}
            for name, value in final.items():
                loss = loss + weights[name] * value
            losses.update(final)
        self.optimizer.zero_grad(set_to_none=True)
        if torch.isfinite(loss):  # a NaN/inf loss would poison the weights: skip the update
            loss.backward()
            self.optimizer.step()
        self.steps += 1
        return {k: float(v.detach()) for k, v in losses.items()}

    @torch.inference_mode()
    def held_out(self, samples: Samples, batch_size: int = 4096) -> dict[str, float]:
        """Losses on samples the network has not been trained on (new self-play games, scored
        before they enter the replay): value MSE against the game outcome z and policy
        cross-entropy against the search. Next to the training losses this measures
        overfitting; a value net that memorises its window's games (consecutive positions
        share one z) scores far worse here than on its training batches."""
        n = len(samples)
        if n == 0:
            return {}
        was_training = self.net.training
        self.net.eval()
        value_sum = policy_sum = 0.0
        for i in range(0, n, batch_size):
            chunk = slice(i, i + batch_size)
            logits, values = self.net(self._tensor(samples.planes[chunk]))
            losses = zero_losses(logits, values, self._tensor(samples.policy[chunk]),
                                 self._tensor(samples.outcome[chunk]))
            value_sum += float(losses["value_loss"]) * len(values)
            policy_sum += float(losses["policy_loss"]) * len(values)
        if was_training:
            self.net.train()
        return {"value_loss": value_sum / n, "policy_loss": policy_sum / n}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        # The config wins over the checkpoint, so a resumed run can change its learning rate.
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr
            group["weight_decay"] = self.config.weight_decay
            if "momentum" in group:
                group["momentum"] = self.config.momentum
        self.steps = state["steps"]
