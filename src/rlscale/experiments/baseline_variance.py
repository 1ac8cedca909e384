"""The baseline reduces the variance of the policy gradient (REINFORCE with a baseline;
GRPO's group mean, RLOO's leave-one-out mean).

No training: on the SFT base, many independent batches of N completions are drawn with the
loop's own sampler (`InProcessRollouts.draw`: N / G prompts x G completions, scored by the
task's verifier), and for each batch the gradient of the run's surrogate loss
(`objectives.policy_loss` on the trainer's forward, at theta = theta_old) is taken once per
advantage estimator, on the same samples:

    none   A_i = R_i                        (REINFORCE without a baseline)
    mean   A_i = R_i - mean(group)          (GRPO's default here)
    rloo   A_i = R_i - mean(others)         (= G/(G-1) x mean: an exact rescaling)
    std    A_i = (R_i - mean) / std(group)  (the original GRPO)

Measured per estimator and group size G: the trace of the gradient's covariance across
batches (the mean squared deviation of the flattened gradient from its mean, with the K - 1
correction) and the noise share tr(Cov) / E|g|^2, which does not depend on the advantage's
scale. `none` and `rloo` have the same expected gradient, so their traces compare directly;
`std` changes the expectation (it reweights prompts) and compares by the noise share. A
batch holds N completions whatever G, so the group sizes compare at equal samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..rlvr import objectives
from ..rlvr.advantages import group_advantages
from ..rlvr.logprobs import completion_logprobs
from ..rlvr.model import load_model
from .measure import policy_batch, rollout_source
from .plots import plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm, arm_config
from .spec import Experiment, Numbers
from .stats import cell, curve, paired
from .verdict import Effect

NAME = "baseline_variance"
CLAIM = ("A baseline reduces the variance of the policy gradient: at every group size G in "
         "{2, 4, 8, 16}, the group's leave-one-out mean as the baseline gives a gradient with "
         "less variance than the raw reward, at the same expected gradient.")
GROUP_SIZES = (2, 4, 8, 16)

# name -> the [N] advantages of [N] rewards in consecutive groups of G
ESTIMATORS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "none": lambda rewards, size: rewards.float(),
    "mean": lambda rewards, size: group_advantages(rewards, size),
    "rloo": lambda rewards, size: group_advantages(rewards, size,
                                                              leave_one_out=True),
    "std": lambda rewards, size: group_advantages(rewards, size,
                                                             std_normalize=True),
}
LABELS = {"none": "no baseline (raw reward)", "mean": "group mean", "rloo": "leave-one-out (RLOO)",
          "std": "group mean / group std"}


@dataclass(frozen=True)
class Settings:
    completions: int   # per batch, whatever G (N / G prompts)
    batches: int       # independent batches per group size (K)
    decomposed: int    # of them, the first this many also take every sample's own gradient


SETUP = ("No training: on the SFT base, independent batches of N completions (N/G prompts x "
         "G, the loop's sampler and verifier) for G in {2, 4, 8, 16}; for each batch the "
         "gradient of the run's surrogate loss with four advantages on the same samples "
         "(raw reward, group mean, leave-one-out, group mean / std); the trace of the "
         "gradient covariance across batches, and its share of E|g|^2. Known-answer check: "
         "on 8 of the batches every sample's own gradient, which predicts each estimator's "
         "E|g|^2 without the cross terms and compares the wrong samples' gradient norms with "
         "the right ones'.")
SETTINGS = {"quick": Settings(completions=16, batches=6, decomposed=2),
            "full": Settings(completions=32, batches=32, decomposed=8)}


def arms(scale: str) -> list[Arm]:
    return []  # nothing is trained: every measurement is on the base model


@dataclass
class Moments:
    """Running first and second moments of flattened gradients (float64)."""

    total: torch.Tensor | None = None
    squared_norms: float = 0.0
    count: int = 0

    def add(self, gradient: torch.Tensor) -> None:
        g = gradient.double()
        self.total = g.clone() if self.total is None else self.total + g
        self.squared_norms += float(g.dot(g))
        self.count += 1

    def trace_covariance(self) -> float:
        """sum_k |g_k - mean|^2 / (K - 1): the trace of the sample covariance."""
        mean = self.total / self.count
        return max(self.squared_norms - self.count * float(mean.dot(mean)), 0.0) / (self.count - 1)

    def mean_squared_norm(self) -> float:
        return self.squared_norms / self.count


@dataclass
class Tally:
    moments: dict[str, Moments] = field(default_factory=lambda: {e: Moments() for e in ESTIMATORS})
    rewards: list[float] = field(default_factory=list)
    uniform_groups: list[float] = field(default_factory=list)
    diagonal: list[dict[str, float]] = field(default_factory=list)


def surrogate_gradients(model, batch, objective: objectives.Objective,
                        advantages: dict[str, torch.Tensor], temperature: float,
                        pack: bool) -> dict[str, torch.Tensor]:
    """The flattened gradient of the run's surrogate loss at theta = theta_old, one per set of
    advantages, from one forward (the trainer's `completion_logprobs`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    logp, _ = completion_logprobs(model, batch, temperature, pack=pack)
    out: dict[str, torch.Tensor] = {}
    for i, (name, adv) in enumerate(advantages.items()):
        inputs = objectives.LossInputs(logp, logp.detach(), adv, batch.mask)
        loss = objectives.policy_loss(inputs, objective).loss
        grads = torch.autograd.grad(loss, params, retain_graph=i < len(advantages) - 1,
                                    allow_unused=True)
        out[name] = torch.cat([(torch.zeros_like(p) if g is None else g).flatten()
                               for p, g in zip(params, grads, strict=True)])
    return out


def sample_squared_norms(model, batch, objective: objectives.Objective, temperature: float,
                         pack: bool) -> list[float]:
    """|g_i|^2 of every sample's own gradient, `g_i` the gradient of the surrogate with
    advantage 1 on sample i alone (normalised by the whole batch's counts, as in the
    batch's loss): the batch's gradient is `sum_i A_i g_i`, linear in the advantages at
    theta = theta_old, so these norms predict each estimator's second moment."""
    params = [p for p in model.parameters() if p.requires_grad]
    count, tokens = len(batch), float(batch.mask.sum())
    norms = []
    for i in range(count):
        one = batch.select(torch.tensor([i]))
        logp, _ = completion_logprobs(model, one, temperature, pack=pack)
        inputs = objectives.LossInputs(logp, logp.detach(), torch.ones(1), one.mask,
                                       num_sequences=count, num_tokens=tokens)
        grads = torch.autograd.grad(objectives.policy_loss(inputs, objective).loss, params,
                                    allow_unused=True)
        norms.append(float(sum((g.double() ** 2).sum() for g in grads if g is not None)))
    return norms


def diagonal_moments(norms: list[float], rewards: torch.Tensor,
                     advantages: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per estimator `sum_i A_i^2 |g_i|^2`: the second moment of `sum_i A_i g_i` without
    the cross terms between samples (the known-answer prediction); and the mean |g_i|^2
    of the right and the wrong samples."""
    norm = torch.tensor(norms, dtype=torch.float64)
    out = {f"{e}/diagonal": float((a.double() ** 2 * norm).sum()) for e, a in advantages.items()}
    right = rewards > 0
    out["right_sq_norm"] = float(norm[right].mean()) if right.any() else math.nan
    out["wrong_sq_norm"] = float(norm[~right].mean()) if (~right).any() else math.nan
    return out


def measure_seed(ctx: Context, seed: int, s: Settings) -> dict[str, dict[str, float]]:
    """Per group size: each estimator's trace of covariance and mean squared norm, and the
    batches' mean reward and share of groups with equal rewards."""
    model, tokenizer = load_model(ctx.base)
    out: dict[str, dict[str, float]] = {}
    for size in GROUP_SIZES:
        cfg = arm_config(ctx, Arm("measure", (f"rollout.group_size={size}",
                                              f"rollout.prompts_per_step={s.completions // size}")),
                         seed)
        objective = cfg.resolved_objective()
        tally = Tally()
        with rollout_source(model, tokenizer, cfg) as source:
            for k in range(s.batches):
                group = source.draw(k, 0, 0)
                rewards = group.rewards
                advantages = {e: fn(rewards, size) for e, fn in ESTIMATORS.items()}
                batch = policy_batch(group, advantages["mean"], tokenizer.pad_token_id)
                model.train()
                grads = surrogate_gradients(model, batch, objective, advantages,
                                            cfg.rollout.temperature, cfg.train.pack)
                for e, g in grads.items():
                    tally.moments[e].add(g)
                if k < s.decomposed:
                    norms = sample_squared_norms(model, batch, objective,
                                                 cfg.rollout.temperature, cfg.train.pack)
                    tally.diagonal.append(diagonal_moments(norms, rewards, advantages))
                per_group = rewards.view(-1, size)
                tally.rewards.append(float(rewards.mean()))
                tally.uniform_groups.append(float(
                    (per_group.max(1).values == per_group.min(1).values).float().mean()))
        row: dict[str, float] = {"reward_mean": sum(tally.rewards) / len(tally.rewards),
                                 "uniform_group_share": sum(tally.uniform_groups)
                                 / len(tally.uniform_groups)}
        for e, m in tally.moments.items():
            row[f"{e}/trace_cov"] = m.trace_covariance()
            row[f"{e}/mean_sq_norm"] = m.mean_squared_norm()
        for key in tally.diagonal[0] if tally.diagonal else ():
            values = [d[key] for d in tally.diagonal if math.isfinite(d[key])]
            row[key] = sum(values) / len(values) if values else math.nan
        out[str(size)] = row
    return out


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    per_seed = [measure_seed(ctx, seed, s) for seed in ctx.seeds]
    return {"seeds": list(ctx.seeds), "group_sizes": list(GROUP_SIZES),
            "completions": s.completions, "batches": s.batches, "per_seed": per_seed}


def _values(numbers: Numbers, size: int, key: str) -> list[float]:
    return [seed[str(size)][key] for seed in numbers["per_seed"]]


def noise_share(numbers: Numbers, size: int, estimator: str) -> list[float]:
    """tr(Cov) / E|g|^2 per seed: the share of the gradient's second moment that is noise."""
    return [t / max(m, 1e-300) for t, m in zip(_values(numbers, size, f"{estimator}/trace_cov"),
                                                _values(numbers, size, f"{estimator}/mean_sq_norm"),
                                                strict=True)]


def _log(values: list[float]) -> list[float]:
    return [math.log(max(v, 1e-300)) for v in values]


def _ratios(numbers: Numbers, size: int, key: str, estimator: str) -> list[float]:
    return [a / max(b, 1e-300) for a, b in zip(_values(numbers, size, f"{estimator}/{key}"),
                                                _values(numbers, size, f"none/{key}"),
                                                strict=True)]


def second_moment_check(numbers: Numbers, size: int, estimator: str) -> str:
    """`measured / predicted`: the estimator's E|g|^2 over no baseline's, measured on the
    batch gradients and predicted from the samples' own gradients without cross terms."""
    return (f"{cell(_ratios(numbers, size, 'mean_sq_norm', estimator), 2)} / "
            f"{cell(_ratios(numbers, size, 'diagonal', estimator), 2)}")


def known_answer_note(numbers: Numbers) -> str:
    """The known answer the decomposition gives: with every sample's own gradient g_i, a
    baseline b changes a sample's term from R^2 |g|^2 to (R - b)^2 |g|^2; it adds variance
    when the wrong samples (R = 0, term b^2 |g|^2) carry much larger gradients than the
    right ones, which is what the norms measure."""
    parts = []
    for size in numbers["group_sizes"]:
        right = _values(numbers, size, "right_sq_norm")
        wrong = _values(numbers, size, "wrong_sq_norm")
        ratio = [w / r for w, r in zip(wrong, right, strict=True)
                 if math.isfinite(w) and math.isfinite(r) and r > 0]
        if ratio:
            parts.append(f"G={size}: {cell(ratio, 2)}")
    return ("Known-answer check: the batch gradient is sum_i A_i g_i (linear in the advantages "
            "at theta_old), so each estimator's E|g|^2 is predicted from every sample's own "
            "gradient g_i as sum_i A_i^2 |g_i|^2, without the cross terms; the last column "
            "compares it with the measured one. A baseline b turns a wrong sample's term "
            "from 0 into b^2 |g_i|^2, so it adds variance where the wrong samples' gradients "
            "are much larger than the right ones'. Their mean |g_i|^2, wrong over right: "
            + ("; ".join(parts) if parts else "no batch had both") + ".")


def analyse(numbers: Numbers) -> Analysis:
    effects, rows = [], []
    for size in numbers["group_sizes"]:
        none, rloo = (_values(numbers, size, f"{e}/trace_cov") for e in ("none", "rloo"))
        effects.append(Effect(f"G={size}: log tr Cov, RLOO - no baseline",
                              paired(_log(none), _log(rloo)), expected_sign=-1,
                              min_effect=0.1))
    for size in numbers["group_sizes"]:
        effects.append(Effect(f"G={size}: noise share, std-normalised - RLOO",
                              paired(noise_share(numbers, size, "rloo"),
                                     noise_share(numbers, size, "std")),
                              expected_sign=-1, primary=False, min_effect=0.01))
    decomposed = "none/diagonal" in numbers["per_seed"][0][str(numbers["group_sizes"][0])]
    for size in numbers["group_sizes"]:
        base = _values(numbers, size, "none/trace_cov")
        for e in ESTIMATORS:
            trace = _values(numbers, size, f"{e}/trace_cov")
            rows.append([str(size), LABELS[e], cell(trace, 4),
                         cell([t / b for t, b in zip(trace, base, strict=True)], 3),
                         cell(noise_share(numbers, size, e), 3),
                         *([second_moment_check(numbers, size, e)] if decomposed else [])])
    table = Table(["G", "advantage", "tr Cov of the gradient", "vs no baseline",
                   "noise share tr Cov / E|g|^2",
                   *(["E|g|^2 vs no baseline: measured / per-sample prediction"]
                     if decomposed else [])], rows)
    shares = ", ".join(f"G={size}: reward {cell(_values(numbers, size, 'reward_mean'), 2)}, "
                       f"groups with equal rewards {cell(_values(numbers, size, 'uniform_group_share'), 2)}"
                       for size in numbers["group_sizes"])
    notes = [f"{numbers['batches']} independent batches of {numbers['completions']} completions "
             "(N / G prompts x G) per group size and seed, from the SFT base; the gradient of the "
             "run's surrogate loss (configs/rlvr/reasoning.yaml: GRPO's per-sequence token mean) "
             "over all the model's weights.",
             "The group mean and RLOO differ by the exact factor G/(G-1), so their variances "
             "differ by (G/(G-1))^2 and their noise shares are equal.",
             f"The batches: {shares}.",
             "Why a baseline can add variance here: with 0/1 rewards at success rate p, a "
             "sample's squared advantage is R^2 (mean p) without a baseline and, with the mean "
             "of its G - 1 siblings, (R - b)^2 (mean p(1-p) G/(G-1)): the baseline lowers it "
             "only where p > 1/G. A hard prompt's wrong samples add nothing to the raw "
             "estimate, and a one-sample baseline adds its own noise."]
    if decomposed:
        notes.append(known_answer_note(numbers))
    worse = [e.name.split(":")[0] for e in effects if e.primary and e.verdict == "contradicts"]
    if worse:
        notes.append(f"The leave-one-out baseline measurably raised the variance at {', '.join(worse)}: "
                     "the claim fails there, on this task's sparse 0/1 rewards (see the batch "
                     "rewards against 1/G above).")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    sizes = numbers["group_sizes"]
    n_seeds = len(numbers["seeds"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for e in ESTIMATORS:
        trace, se = curve([[numbers["per_seed"][i][str(g)][f"{e}/trace_cov"] for g in sizes]
                           for i in range(n_seeds)])
        axes[0].errorbar(sizes, trace, yerr=se, marker="o", capsize=4, label=LABELS[e])
        share, se = curve([[noise_share(numbers, g, e)[i] for g in sizes] for i in range(n_seeds)])
        axes[1].errorbar(sizes, share, yerr=se, marker="o", capsize=4, label=LABELS[e])
    axes[0].set_yscale("log")
    axes[0].set_title("trace of the gradient covariance")
    axes[1].set_title("noise share tr Cov / E|g|^2")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(g) for g in sizes])
        ax.set_xlabel(f"group size G ({numbers['completions']} completions per batch)")
        tidy(ax)
    fig.suptitle(f"policy-gradient variance on the SFT base, mean ± SE over {n_seeds} seed(s)")
    return save_figure(fig, out)


# minutes: 2 seeds x 4 G x 32 batches of 32 (~1.4 s each: sampling, a forward, 4 backwards)
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=3)
