"""The sequence ratio's variance grows with length; GSPO's length-normalised ratio does not
(Zheng et al. 2025, "Group Sequence Policy Optimization").

A sequence's likelihood ratio is the product of its token ratios, `exp(sum_t delta_t)`: if
every token's log-ratio moves a little, the sum's spread grows with the number of tokens,
and one clip range cannot fit short and long completions alike. GSPO takes the geometric
mean, `exp(mean_t delta_t)`, whose spread does not grow (it falls, for independent tokens).

Measured where ratios leave 1: batch reuse. From the SFT base, a short GRPO run with the
library's trainer (`PolicyTrainer.step`, 4 epochs x 4 minibatches per batch, the loop's
sampler and advantages, float32 so that rounding adds nothing); after every step, on the
step's own samples, the ratios of the updated policy to the one that sampled them
(`objectives.sequence_ratio`, plain and length-normalised; and the token ratios), grouped
into length buckets (quartiles of the completion lengths). Per bucket the variance of each
log-ratio (the ratio's own variance is ruled by a few outliers: it is the exp of a sum); per
seed, the slope of log variance against log length.

Beside it, what the spread does to training: GRPO (token ratios), the sequence-level ratio
and GSPO, each with its preset's clip range and aggregation, trained from the same base and
seeds under the same 4 x 4 reuse; their clip fractions, the largest per-step KL(old || new)
(the spikes a wide ratio spread lets through) and held-out pass@1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..rlvr import objectives, token_math
from ..rlvr.advantages import group_advantages
from ..rlvr.model import load_model
from .measure import held_out, policy_batch, policy_trainer, rollout_source
from .plots import plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm, arm_config, mean_of, series
from .spec import Experiment, Numbers, grpo_arms
from .stats import cell, curve, paired
from .verdict import Effect

NAME = "gspo_ratio_variance"
CLAIM = ("With batch reuse, the spread of the sequence-level importance ratio (the variance of "
         "its log) grows with completion length; GSPO's length-normalised ratio does not grow "
         "with it.")
RATIOS = ("sequence", "gspo", "token")
LABELS = {"sequence": "sequence ratio: sum_t", "gspo": "GSPO ratio: mean_t",
          "token": "token ratio (GRPO)"}
# Token sums (no 1/|y|): under GRPO's per-sequence mean every sequence's update has the same
# mass whatever its length, which cancels the growth with length the claim is about.
REUSE = ("train.epochs=4", "train.minibatches=4", "train.lr=1e-4", "train.compute_dtype=float32",
         "loss.kl_coef=0", "loss.aggregation=seq-mean-token-sum")
BUCKETS = 4


@dataclass(frozen=True)
class Settings:
    steps: int       # GRPO steps, each measured
    train_steps: int  # steps of each trained objective
    prompts: int     # their held-out pass@1
    samples: int


# The trained comparison: each objective's own preset under the measured reuse.
OBJECTIVES = {"grpo": ("objective=grpo",), "sequence": ("objective=sequence",),
              "gspo": ("objective=gspo",)}
TRAIN_REUSE = ("train.epochs=4", "train.minibatches=4", "train.lr=1e-4",
               "train.compute_dtype=float32", "loss.kl_coef=0", "eval.every=0")


SETUP = ("From the SFT base, GRPO steps by the library's trainer "
         "with each batch reused 4 epochs x 4 minibatches (lr 1e-4, float32, token sums: no "
         "1/|y|, which would give every sequence the same update mass); after each "
         "step the sequence ratio, GSPO's length-normalised one and the token ratios of the "
         "new policy to the old on the step's samples; the variance of their logs by length "
         "quartile. Beside it, GRPO, the sequence ratio and GSPO trained 60 steps each "
         "(their presets) under the same reuse: clip fractions, KL spikes, pass@1.")
SETTINGS = {"quick": Settings(steps=3, train_steps=3, prompts=16, samples=2),
            "full": Settings(steps=40, train_steps=60, prompts=400, samples=4)}


def arms(scale: str) -> list[Arm]:
    # The variance itself is measured inside `measure` (ratios are not logged per sequence);
    # these are the trained comparison's runs.
    return grpo_arms(SETTINGS[scale].train_steps, OBJECTIVES, *TRAIN_REUSE)


def training_figures(run: TrainedArm, s: Settings) -> dict[str, float]:
    """A trained objective's clip fraction (all, and of the completions below and above the
    step's median length) and KL(old || new) per step (mean and largest over its steps),
    and its held-out pass@1."""
    rows = run.metrics()
    _, kl = series(rows, "kl/old_new")
    return {"clip_frac": mean_of(rows, "clip/frac") or 0.0,
            "clip_frac_short": mean_of(rows, "clip/frac_short") or 0.0,
            "clip_frac_long": mean_of(rows, "clip/frac_long") or 0.0,
            "kl_mean": sum(kl) / len(kl) if kl else 0.0, "kl_max": max(kl, default=0.0),
            "pass@1": held_out(run.final, run.config(), seed=run.seed, budget=s).pass_at[1]}


@torch.no_grad()
def step_log_ratios(logp_after: torch.Tensor, logp_before: torch.Tensor,
                    mask: torch.Tensor) -> dict[str, list]:
    """One step's log-ratios on its samples: per sequence its length and both sequence
    log-ratios (`objectives.sequence_ratio`), and every token's with its sequence's length."""
    lengths = mask.sum(dim=-1)
    sequence = objectives.log_sequence_ratio(logp_after, logp_before, mask)
    gspo = objectives.log_sequence_ratio(logp_after, logp_before, mask, length_normalize=True)
    active = mask > 0
    token = (logp_after - logp_before)[active]
    token_lengths = lengths[:, None].expand_as(mask)[active]
    return {"lengths": lengths.tolist(), "sequence": sequence.tolist(), "gspo": gspo.tolist(),
            "token": token.tolist(), "token_lengths": token_lengths.tolist()}


def bucket_edges(lengths: list[float], buckets: int = BUCKETS) -> list[float]:
    """Upper edges of `buckets` length buckets at the quantiles of `lengths` (distinct)."""
    ordered = sorted(lengths)
    edges = [ordered[min(len(ordered) - 1, math.ceil(len(ordered) * (i + 1) / buckets) - 1)]
             for i in range(buckets)]
    return sorted(set(edges))


def bucket_of(length: float, edges: list[float]) -> int:
    return next(i for i, e in enumerate(edges) if length <= e)


def variance(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = sum(values) / len(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1)


def by_bucket(pooled: dict[str, list]) -> dict[str, list[float]]:
    """Per length bucket: mean length, count and each log-ratio's variance."""
    edges = bucket_edges(pooled["lengths"])
    seq_bucket = [bucket_of(n, edges) for n in pooled["lengths"]]
    tok_bucket = [bucket_of(n, edges) for n in pooled["token_lengths"]]
    out: dict[str, list[float]] = {"mean_length": [], "sequences": []}
    out.update({r: [] for r in RATIOS})
    for b in range(len(edges)):
        lengths = [n for n, k in zip(pooled["lengths"], seq_bucket, strict=True) if k == b]
        out["mean_length"].append(sum(lengths) / len(lengths))
        out["sequences"].append(len(lengths))
        for r in ("sequence", "gspo"):
            out[r].append(variance([v for v, k in zip(pooled[r], seq_bucket, strict=True)
                                    if k == b]))
        out["token"].append(variance([v for v, k in zip(pooled["token"], tok_bucket,
                                                        strict=True) if k == b]))
    return out


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x (0 with fewer than two points)."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(max(y, 1e-300)) for y in ys]
    if len(lx) < 2:
        return 0.0
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    sxx = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / sxx if sxx else 0.0


def measure_seed(ctx: Context, seed: int, s: Settings) -> dict:
    cfg = arm_config(ctx, Arm("measure", REUSE), seed)
    objective = cfg.resolved_objective()
    model, tokenizer = load_model(ctx.base)
    trainer = policy_trainer(model, cfg)
    pooled: dict[str, list] = {"lengths": [], "sequence": [], "gspo": [], "token": [],
                               "token_lengths": []}
    kl_per_step = []
    with rollout_source(model, tokenizer, cfg) as source:
        for step in range(s.steps):
            group = source.draw(step, 0, trainer.version)
            advantages = group_advantages(
                group.rewards, cfg.rollout.group_size,
                std_normalize=objective.advantage_std_normalize,
                leave_one_out=objective.advantage_leave_one_out)
            batch = policy_batch(group, advantages, tokenizer.pad_token_id)
            generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
            before = trainer.step(batch, generator)
            after = trainer.score_logprobs(model, batch)
            ratios = step_log_ratios(after, before.logp_before, batch.mask)
            for key, values in ratios.items():
                pooled[key].extend(values)
            kl = token_math.kl_penalty(before.logp_before, after, "k3")  # KL(old || new)
            kl_per_step.append(float(token_math.masked_mean(kl, batch.mask)))
    return {**by_bucket(pooled), "kl_new_old": sum(kl_per_step) / len(kl_per_step),
            "completions": len(pooled["lengths"])}


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    trained_figures = {name: [training_figures(run, s) for run in trained[name]]
                      for name in OBJECTIVES}
    return {"seeds": list(ctx.seeds), "steps": s.steps, "train_steps": s.train_steps,
            "per_seed": [measure_seed(ctx, seed, s) for seed in ctx.seeds],
            "trained": trained_figures}


def slopes(numbers: Numbers, ratio: str) -> list[float]:
    return [slope(p["mean_length"], p[ratio]) for p in numbers["per_seed"]]


def analyse(numbers: Numbers) -> Analysis:
    seq, gspo, token = (slopes(numbers, r) for r in RATIOS)
    effects = [
        Effect("slope of log Var(log sequence ratio) on log length", tuple(seq),
               expected_sign=+1, min_effect=0.1),
        Effect("slope: sequence ratio - GSPO ratio", paired(gspo, seq), expected_sign=+1,
               min_effect=0.1),
        Effect("slope of log Var(log GSPO ratio) on log length", tuple(gspo), expected_sign=-1,
               primary=False, min_effect=0.1),
    ]
    trained = numbers.get("trained")
    if trained:
        def of(name: str, key: str) -> list[float]:
            return [f[key] for f in trained[name]]

        effects += [
            Effect("trained: largest KL(old || new) a step, sequence - GSPO",
                   paired(of("gspo", "kl_max"), of("sequence", "kl_max")), expected_sign=+1,
                   primary=False, min_effect=1e-3),
            Effect("trained: pass@1, GSPO - sequence", paired(of("sequence", "pass@1"),
                                                             of("gspo", "pass@1")),
                   expected_sign=+1, primary=False, min_effect=0.02)]
    per_seed = numbers["per_seed"]
    rows = []
    for b in range(min(len(p["mean_length"]) for p in per_seed)):
        rows.append([str(b + 1), cell([p["mean_length"][b] for p in per_seed], 1),
                     *(cell([p[r][b] for p in per_seed], 6) for r in RATIOS)])
    rows.append(["slope (log-log)", "", cell(seq, 2), cell(gspo, 2), cell(token, 2)])
    table = Table(["length bucket", "mean length", *(f"Var log {LABELS[r]}" for r in RATIOS)],
                  rows)
    notes = [f"{numbers['steps']} GRPO steps per seed from the SFT base, each batch reused for "
             "4 epochs x 4 minibatches (lr 1e-4); the ratios of the policy after each step to "
             f"the one that sampled it, on the step's {per_seed[0]['completions'] // numbers['steps']} "
             "completions; buckets at the quartiles of the completion lengths. KL(old || new) "
             "per token and step: " + cell([p["kl_new_old"] for p in per_seed], 5) + "."]
    if trained:
        notes.append(Table(
            ["trained objective", "clip fraction", "short completions", "long completions",
             "KL(old || new) a step", "largest", "held-out pass@1"],
            [[name, cell([f["clip_frac"] for f in figures], 4),
              *(cell([f.get(f"clip_frac_{half}", math.nan) for f in figures], 4)
                for half in ("short", "long")),
              cell([f["kl_mean"] for f in figures], 5), cell([f["kl_max"] for f in figures], 5),
              cell([f["pass@1"] for f in figures])] for name, figures in trained.items()]
        ).markdown())
        notes.append(f"Trained: each objective's preset (clip ranges: token 0.2, sequence 0.2, "
                     f"GSPO 3e-4 / 4e-4) for {numbers['train_steps']} steps under the same "
                     "4 x 4 reuse; the clip fraction and KL are the loop's per-step figures; "
                     "short and long: the completions up to and above each step's median "
                     "length.")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    per_seed = numbers["per_seed"]
    n = min(len(p["mean_length"]) for p in per_seed)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    lengths = curve([p["mean_length"][:n] for p in per_seed])[0]
    for r in RATIOS:
        values, se = curve([p[r][:n] for p in per_seed])
        ax.errorbar(lengths, values, yerr=se, marker="o", capsize=4, label=LABELS[r])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("completion length (bucket mean, tokens)")
    ax.set_ylabel("variance of log(new / old)")
    ax.set_title(f"ratio variance by length, 4x4 batch reuse ({len(per_seed)} seed(s))")
    tidy(ax, which="both")
    return save_figure(fig, out)


# minutes: a seed's 40 measured steps of 16 updates (~4 s each with sampling and the extra
# forwards, ~3 min), plus 3 objectives x 60 trained steps (~2.5 min each) and their evals
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=12)
