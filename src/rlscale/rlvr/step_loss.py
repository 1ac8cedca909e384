"""What one trainer step asks of an objective: the one face of it the trainer sees.

The trainer (trainer.py) does forward, loss, backward and optimiser step, and knows no
algorithm. Everything that differs between objectives reaches it through a `StepLoss`:
whether a reference forward is needed (the KL term), which tokens get the gradient (the
top-rho entropy tokens, or all), the loss's inputs built from a micro-batch's forward and
pi_old (the teacher's per-token term, the reference log-probs), the loss itself, the
step-level figures an objective adds (the reverse KL to a teacher), and with PPO's critic
the step's per-token advantages before the update and the critic's own update after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .advantages import reverse_kl_per_token, teacher_mixed_advantages
from .batch import MicroBatch, PolicyBatch
from .critic import Critic, CriticTargets, critic_advantages
from .objectives import LossInputs, LossOutput, Objective, policy_loss
from .token_math import top_entropy_mask


@dataclass(frozen=True)
class StepLoss:
    """The loss of one `Objective` as a trainer step uses it; `critic`: the value model of
    an objective with `critic` set (PPO), None otherwise. A driver whose learner group's
    ranks hold the critic keeps an objective with `critic` set and no Critic: it never
    steps, and `prepare` refuses if it is asked to."""

    objective: Objective
    critic: Critic | None = None

    def __post_init__(self) -> None:
        if self.critic is not None and not self.objective.critic:
            raise ValueError("a Critic was given to an objective without critic set")

    def prepare(self, batch: PolicyBatch) -> tuple[PolicyBatch, CriticTargets | None,
                                                    dict[str, float]]:
        """The batch the step trains on, before its update: with a critic, its rewards
        turned into per-token GAE advantages, with the critic's targets and figures."""
        if self.objective.critic and self.critic is None:
            raise ValueError("the objective learns a critic and this trainer holds none (a "
                             "learner group's ranks hold it): step the group, not this trainer")

        if self.critic is None:
            return batch, None, {}
        o = self.objective
        return critic_advantages(self.critic, batch, gamma=o.gae_gamma, lam=o.gae_lambda,
                                 whiten_advantages=o.whiten_advantages)

    def finish(self, batch: PolicyBatch, targets: CriticTargets | None,
               generator: torch.Generator | None) -> dict[str, float]:
        """After the policy's update: the critic's own, on the same batch."""
        if self.critic is None or targets is None:
            return {}
        return self.critic.fit(batch, targets, generator)

    @property
    def needs_reference(self) -> bool:
        """The loss has a KL term to the frozen reference, so the step scores it."""
        return self.objective.kl_coef > 0

    def gradient_mask(self, mask: Tensor, entropy: Callable[[], Tensor]) -> Tensor | None:
        """The minibatch's tokens that get the gradient, given its completion `mask` and a
        function that computes its token entropies (called only when needed); None: every
        completion token. With `entropy_top_rho < 1` the top-rho share by entropy of the
        whole minibatch, so the micro-batch size never changes which tokens train."""
        rho = self.objective.entropy_top_rho
        return top_entropy_mask(entropy(), mask, rho) if rho < 1.0 else None

    def inputs(self, part: MicroBatch, logp: Tensor, old_logp: Tensor,
               ref_logp: Tensor | None) -> LossInputs:
        """The loss's inputs of one micro-batch, given its forward (`logp`) and pi_old. With
        a teacher the advantages gain its per-token term against pi_old; with one update
        per step pi_old is this very forward, so the term is formed after it."""
        micro, o = part.batch, self.objective
        advantages = teacher_mixed_advantages(micro.advantages, old_logp, micro.teacher_logprobs,
                                              micro.mask, reward_weight=o.reward_weight,
                                              teacher_weight=o.teacher_weight)
        return LossInputs(logp, old_logp, advantages, part.mask,
                          behaviour_logp=micro.sampler_logprobs, ref_logp=ref_logp,
                          num_sequences=part.num_sequences, num_tokens=part.num_tokens)

    def __call__(self, inputs: LossInputs) -> LossOutput:
        return policy_loss(inputs, self.objective)

    def step_metrics(self, batch: PolicyBatch, logp_before: Tensor) -> dict[str, float]:
        """The figures this objective adds to a step's: with a teacher, the per-token
        reverse KL from the student (as it was before the step) to it."""
        if batch.teacher_logprobs is None:
            return {}
        return {"opd/reverse_kl": reverse_kl_per_token(logp_before, batch.teacher_logprobs,
                                                       batch.mask)}
