"""SFT is a policy gradient with weight 1/pi, shown exactly on a policy small enough to enumerate.

With reward `R(y) = 1{y = y*}` and importance weight `1/pi(y|x)`, the on-policy policy
gradient is the SFT gradient:

    E_{y~pi}[ (1/pi(y|x)) 1{y = y*} grad log pi(y|x) ]
        = sum_y pi(y|x) (1/pi(y|x)) 1{y = y*} grad log pi(y|x) = grad log pi(y*|x).

Without the weight it is `pi(y*|x) grad log pi(y*|x)`, the gradient of DFT with the sequence
weight (`imitation.dft_loss(weight="sequence")`): RL from a 0/1 reward, DFT and SFT differ
only in the weight. The weight is not a constant: one draw of the Monte-Carlo estimator is
0 (with probability 1 - p) or `g*/p` (with probability p = pi(y*|x), g* = grad log pi(y*|x)),
unbiased but with covariance trace `||g*||^2 (1 - p) / p`, which blows up as the target
becomes improbable.

The policy is an autoregressive softmax table: one row of logits per prefix, so every
sequence of `length` tokens over a `vocab`-token vocabulary has an exact probability and
gradient. `python -m rlscale.rlvr.sft_pg` prints the variance table of docs/objectives.md.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from . import imitation, objectives

Sequence = tuple[int, ...]


@dataclass(frozen=True)
class TablePolicy:
    """pi(y|x) = prod_t softmax(logits[row(y_<t)])[y_t] over sequences of `length` tokens in
    `range(vocab)`. `logits` is `[1 + V + ... + V^(L-1), V]`, one row per prefix."""

    logits: Tensor
    vocab: int
    length: int

    def sequences(self) -> list[Sequence]:
        """Every sequence, in lexicographic order: the space the expectations run over."""
        return list(itertools.product(range(self.vocab), repeat=self.length))


def table_policy(vocab: int = 3, length: int = 3, *, seed: int = 0,
                 scale: float = 1.0) -> TablePolicy:
    """A random table policy in float64, logits ~ N(0, scale^2)."""
    rows = sum(vocab ** k for k in range(length))
    generator = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(rows, vocab, generator=generator, dtype=torch.float64)
    return TablePolicy(logits, vocab, length)


def prefix_rows(prefixes: Tensor, vocab: int) -> Tensor:
    """`[N, k]` prefixes -> `[N]` table rows: the rows of length-k prefixes follow those of
    every shorter one (`1 + V + ... + V^(k-1)` of them), in base-V order."""
    k = prefixes.shape[-1]
    offset = sum(vocab ** j for j in range(k))
    code = torch.zeros(prefixes.shape[0], dtype=torch.long)
    for t in range(k):
        code = code * vocab + prefixes[:, t]
    return offset + code


def token_logprobs(policy: TablePolicy, sequences: Tensor, logits: Tensor | None = None) -> Tensor:
    """`[N, L]` sequences -> `[N, L]` log pi(y_t | y_<t, x) (through `logits`, default the
    policy's, so that autograd can reach them)."""
    logits = policy.logits if logits is None else logits
    columns = []
    for t in range(policy.length):
        rows = prefix_rows(sequences[:, :t], policy.vocab)
        columns.append(logits[rows].log_softmax(-1).gather(-1, sequences[:, t:t + 1]))
    return torch.cat(columns, dim=-1)


def grad_logprob(policy: TablePolicy, y: Sequence) -> tuple[float, Tensor]:
    """`(pi(y|x), grad_logits log pi(y|x))`, the gradient flattened, by autograd."""
    logits = policy.logits.detach().clone().requires_grad_(True)
    logp = token_logprobs(policy, torch.tensor([y]), logits).sum()
    (grad,) = torch.autograd.grad(logp, logits)
    return float(logp.detach().exp()), grad.flatten()


def importance_weighted_gradient(policy: TablePolicy, target: Sequence) -> Tensor:
    """`E_{y~pi}[(1/pi(y|x)) 1{y = y*} grad log pi(y|x)]` by enumerating every y: the
    policy gradient of the reward 1{y = y*} with importance weight 1/pi. Equals
    `grad log pi(y*|x)`, the SFT gradient."""
    total = torch.zeros(policy.logits.numel(), dtype=torch.float64)
    for y in policy.sequences():
        prob, grad = grad_logprob(policy, y)
        reward = 1.0 if y == tuple(target) else 0.0
        total += prob * (1.0 / prob) * reward * grad
    return total


def plain_policy_gradient(policy: TablePolicy, target: Sequence) -> Tensor:
    """`E_{y~pi}[1{y = y*} grad log pi(y|x)]` by enumeration: the same policy gradient
    without the importance weight. Equals `pi(y*|x) grad log pi(y*|x)`, the DFT gradient
    with the sequence weight."""
    total = torch.zeros(policy.logits.numel(), dtype=torch.float64)
    for y in policy.sequences():
        prob, grad = grad_logprob(policy, y)
        total += prob * (1.0 if y == tuple(target) else 0.0) * grad
    return total


def demonstration_gradient(policy: TablePolicy, target: Sequence, weight: str = "one") -> Tensor:
    """The gradient (flattened) of `imitation.demonstration_loss` summed over the tokens of
    y* (`weight`: `one` = SFT, `token` / `sequence` = DFT), as minimised, negated: the
    direction it moves log pi."""
    logits = policy.logits.detach().clone().requires_grad_(True)
    logp = token_logprobs(policy, torch.tensor([target]), logits)
    loss, _ = imitation.demonstration_loss(
        logp, torch.ones_like(logp), weight=weight,
        aggregate=objectives.Aggregation("seq-mean-token-sum"))
    (grad,) = torch.autograd.grad(loss, logits)
    return -grad.flatten()


def sample_sequences(policy: TablePolicy, n: int, generator: torch.Generator) -> Tensor:
    """`[n, L]` sequences drawn from pi token by token."""
    drawn = torch.zeros(n, 0, dtype=torch.long)
    for _ in range(policy.length):
        probs = policy.logits[prefix_rows(drawn, policy.vocab)].detach().softmax(-1)
        drawn = torch.cat([drawn, torch.multinomial(probs, 1, generator=generator)], dim=-1)
    return drawn


def _draw_values(policy: TablePolicy, target: Sequence,
                 drawn: Tensor) -> tuple[list[Tensor], list[int]]:
    """The estimator's value `(1/pi(y)) 1{y = y*} grad log pi(y)` at each distinct drawn
    sequence, and how often it was drawn."""
    distinct, counts = torch.unique(drawn, dim=0, return_counts=True)
    values = []
    for y in distinct.tolist():
        prob, grad = grad_logprob(policy, tuple(y))
        values.append((1.0 / prob) * (1.0 if tuple(y) == tuple(target) else 0.0) * grad)
    return values, counts.tolist()


def monte_carlo_gradient(policy: TablePolicy, target: Sequence, samples: int,
                         generator: torch.Generator) -> Tensor:
    """`(1/n) sum_i (1/pi(y_i|x)) 1{y_i = y*} grad log pi(y_i|x)` over `n` draws y_i ~ pi:
    the unbiased Monte-Carlo estimate of the SFT gradient as a policy gradient."""
    values, counts = _draw_values(policy, target, sample_sequences(policy, samples, generator))
    return sum(c * v for c, v in zip(counts, values, strict=True)) / samples


@dataclass(frozen=True)
class EstimatorSpread:
    """How noisy one draw of the 1/pi-weighted policy gradient is, for one target."""

    target_prob: float         # p = pi(y*|x)
    weight: float              # 1/p: the importance weight on the draws that hit y*
    variance: float            # trace of one draw's covariance, by enumeration
    relative_variance: float   # variance / ||grad log pi(y*|x)||^2, = (1 - p) / p
    measured_variance: float   # the same trace from `samples` draws
    samples_for_10pct: int     # draws for a 10% relative standard error of the mean


def estimator_spread(policy: TablePolicy, target: Sequence, samples: int,
                     generator: torch.Generator) -> EstimatorSpread:
    """The variance of one draw `X = (1/pi(y)) 1{y = y*} grad log pi(y)`, y ~ pi: exactly,
    `tr Cov X = sum_y pi(y) ||X(y)||^2 - ||E X||^2` over every y, and measured as the
    unbiased sample covariance trace of `samples` draws."""
    mean = importance_weighted_gradient(policy, target)
    second = 0.0
    for y in policy.sequences():
        prob, grad = grad_logprob(policy, y)
        value = (1.0 / prob) * (1.0 if y == tuple(target) else 0.0) * grad
        second += prob * float(value @ value)
    variance = second - float(mean @ mean)
    values, counts = _draw_values(policy, target, sample_sequences(policy, samples, generator))
    sample_mean = sum(c * v for c, v in zip(counts, values, strict=True)) / samples
    spread = sum(c * float((v - sample_mean) @ (v - sample_mean))
                 for c, v in zip(counts, values, strict=True))
    prob, _ = grad_logprob(policy, target)
    relative = variance / float(mean @ mean)
    return EstimatorSpread(prob, 1.0 / prob, variance, relative, spread / (samples - 1),
                           int(round(relative / 0.1 ** 2)))


def less_likely(policy: TablePolicy, target: Sequence, shift: float) -> TablePolicy:
    """The policy with the target token's logit lowered by `shift` at every prefix of y*:
    pi(y*|x) shrinks, the rest of the table is unchanged."""
    logits = policy.logits.detach().clone()
    target_tensor = torch.tensor([target])
    for t, token in enumerate(target):
        logits[prefix_rows(target_tensor[:, :t], policy.vocab), token] -= shift
    return TablePolicy(logits, policy.vocab, policy.length)


def variance_table(shifts: tuple[float, ...] = (-4, -3, -2, -1, 0, 1, 2), *, vocab: int = 3,
                   length: int = 3, target: Sequence = (0, 1, 2), samples: int = 1_000_000,
                   seed: int = 0) -> str:
    """The markdown table of docs/objectives.md: `estimator_spread` as pi(y*|x) shrinks."""
    base = table_policy(vocab, length, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    lines = ["| shift | pi(y*\\|x) | weight 1/pi | tr Cov, one draw (exact) | relative (1-p)/p "
             f"| measured ({samples} draws) | draws for 10% error |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for shift in shifts:
        s = estimator_spread(less_likely(base, target, shift), target, samples, generator)
        lines.append(f"| {shift:g} | {s.target_prob:.2e} | {s.weight:.3g} | {s.variance:.3g} | "
                     f"{s.relative_variance:.3g} | {s.measured_variance:.3g} | "
                     f"{s.samples_for_10pct:,} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(variance_table(samples=args.samples, seed=args.seed))


if __name__ == "__main__":
    main()
