"""Staleness and mismatch on the asynchronous fleets, and the two-factor correction.

The fleets (`runtime.mode: inflight`) let inference workers run up to `k` weight versions
ahead of the trainer: no waiting, but a trained token may have been drawn by older weights,
and by an engine in another precision. The loss's ratio then has two factors (docs/async.md):
pi_theta / pi_old, the trust region the clip keeps, and pi_old / mu, the gap between the
trainer's policy and the sampler's, which the loop can leave alone (`loss.is_correction:
none`, the samples treated as on-policy) or correct: TIS truncates the weight at C, MIS
drops the tokens outside [1/C, C] (C = `loss.is_threshold` = 2).

Arms, all on the real fleets (Ray, one inference worker beside the trainer, each one
thread of the 2 cores): k = 0 (the worker waits for every version), 4 and 8, each without a
correction, with TIS and with MIS. The engine decodes in bf16 beside an fp32 trainer.

Real lag needs a learner slower than inference: each batch is reused 2 epochs x 4
minibatches (8 updates a step, and more drift per version), and running rows keep the KV
cache their old weights wrote (`rollout.recompute_cache_on_update=false`), so the worker
runs ahead as far as k lets it. (Before, with one update a step and the cache rebuilt at
every version, the lag at k = 4 was 1.03 versions and the drift ~2e-4: nothing to
correct.) Measured: the loop's own figures per step (the lag of trained tokens,
KL(mu || pi_old) split into fresh tokens (`behaviour/engine_kl`, the engine's mismatch
alone) and lagged ones (`behaviour/stale_kl`), dropped groups, seconds per step), the
final held-out pass@1, and beside them the fleet simulator's prediction (runtime/simulator.py)
of each k's lag and step time from the k = 0 arm's own measured rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..simulator import (
    FleetConfig,
    InferenceFleet,
    Mode,
    ResponseLengths,
    Trainer,
    Workload,
    simulate,
)
from .measure import held_out
from .plots import band, bars, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm, mean_of, series
from .spec import Experiment, Numbers
from .stats import cell, paired
from .verdict import Effect, Verdict

NAME = "staleness"
CLAIM = ("On the asynchronous fleets with a learner slower than inference, letting inference "
         "run k = 4 versions ahead makes steps faster but trains on tokens drawn further from "
         "the trained policy (KL(mu || pi_old) grows), and the two-factor importance "
         "correction (MIS) recovers the pass@1 the drift costs.")
# The engine's precision: bf16 beside the fp32 trainer, the mismatch the field meets when the
# sampler runs reduced precision. On a CPU without bf16 kernels the engine emulates bf16 (10x
# slower than fp32 on an AVX2-only EPYC), so `Settings.engine_dtype` says which was run.
FLEET = ("runtime.mode=inflight", "runtime.inference_workers=1", "runtime.worker_threads=1",
         "train.threads=1", "train.compute_dtype=float32", "train.epochs=2",
         "train.minibatches=4", "rollout.recompute_cache_on_update=false")


@dataclass(frozen=True)
class ArmSpec:
    k: int
    correction: str  # loss.is_correction


ARMS = {f"k{k}{'' if correction == 'none' else '_' + correction}": ArmSpec(k, correction)
        for k in (0, 4, 8) for correction in ("none", "tis", "mis")}
CURVES = ("staleness/lag_mean", "behaviour/engine_kl", "behaviour/stale_kl", "time/step_s")


@dataclass(frozen=True)
class Settings:
    steps: int
    engine_dtype: str
    prompts: int     # the final models' held-out pass@1
    samples: int
    skip_steps: int  # first steps left out of the time per step (Ray and workers starting)


SETUP = ("GRPO (configs/rlvr/reasoning.yaml) from the SFT base on the in-flight fleets: one "
         "inference worker (rlscale's engine in bf16) beside the fp32 trainer, one thread "
         "each; a slow learner (each batch reused 2 epochs x 4 minibatches) and running rows "
         "keeping their KV cache across versions, so inference runs ahead; "
         "runtime.max_staleness k = 0, 4, 8, each with loss.is_correction none, tis and mis "
         "(C = 2), the same seeds.")
# The quick run checks the pipeline, not the mismatch: an fp32 engine (bf16 is emulated, ~10x
# slower, on a CPU without bf16 kernels) and only the arms the analysis compares.
SETTINGS = {"quick": Settings(steps=4, engine_dtype="float32", prompts=16, samples=2,
                              skip_steps=1),
            "full": Settings(steps=40, engine_dtype="bfloat16", prompts=200, samples=4,
                             skip_steps=2)}


COMPARED = ("k0", "k4", "k4_tis", "k4_mis", "k8", "k8_mis")  # the arms `analyse` compares


def arms(scale: str) -> list[Arm]:
    s = SETTINGS[scale]
    common = (*FLEET, f"train.steps={s.steps}", f"rollout.dtype={s.engine_dtype}",
              "eval.every=0", f"checkpoint.every={s.steps}")
    names = COMPARED if scale == "quick" else tuple(ARMS)
    return [Arm(name, (*common, f"runtime.max_staleness={ARMS[name].k}",
                       f"loss.is_correction={ARMS[name].correction}"))
            for name in names]


# -- pure pieces -------------------------------------------------------------------------

def behaviour_kl(row: dict[str, Any]) -> float | None:
    """KL(mu || pi_old) per trained token at one step: the fresh tokens' (engine mismatch)
    and the lagged tokens' (mismatch and drift) weighted by their shares."""
    share = row.get("behaviour/stale_token_share")
    if share is None:
        return None
    fresh, stale = row.get("behaviour/engine_kl", 0.0), row.get("behaviour/stale_kl", 0.0)
    return (1.0 - share) * fresh + share * stale


def mean_after(rows: list[dict[str, Any]], key: str, skip: int) -> float | None:
    _, values = series([r for r in rows if r.get("step", 0) > skip], key)
    return sum(values) / len(values) if values else None


def simulator_config(k0: dict[str, float], *, steps: int, prompts_per_step: int,
                     group_size: int, max_new_tokens: int, slots: int) -> FleetConfig:
    """The fleet simulator fitted to the k = 0 arm's own rates: the trainer's seconds per
    trained token (its `time/train_s` over the step's tokens) and one worker decoding at the
    tokens/s it measured while busy (a flat per-row cost: the one-thread worker's decode
    step grows about linearly with its rows at these sizes), response lengths log-normal
    around the measured mean with a spread reaching the measured longest."""
    mean_len = max(k0["length_mean"], 1.0)
    sigma = max(math.log(max(k0["length_max"], mean_len) / mean_len) / 2.0, 0.0)
    tokens = prompts_per_step * group_size * mean_len
    return FleetConfig(
        name="staleness", seed=0,
        workload=Workload(steps=steps, prompts_per_step=prompts_per_step,
                          group_size=group_size, prompt_tokens=0,
                          response=ResponseLengths(median=mean_len, sigma=sigma, min=1,
                                                   max=max_new_tokens)),
        inference=InferenceFleet(workers=1, slots=slots, decode_base_s=0.0,
                                 decode_per_slot_s=max(k0["busy_share"], 1e-9)
                                 / max(k0["tokens_per_s"], 1e-9)),
        trainer=Trainer(devices=1, step_base_s=0.0,
                        step_per_token_s=k0["train_s"] / max(tokens, 1.0)),
        modes=[Mode(mode="inflight", max_staleness=k) for k in sorted({s.k for s in ARMS.values()})])


def predictions(cfg: FleetConfig) -> dict[str, dict[str, float]]:
    """The simulator's lag, dropped share and seconds per step for each k."""
    out = {}
    for mode in cfg.modes:
        result = simulate(cfg, mode)
        out[str(mode.max_staleness)] = {"lag_mean": result.staleness_mean,
                                        "dropped_share": result.dropped_share,
                                        "step_s": result.wall_s / cfg.workload.steps}
    return out


# -- measuring ---------------------------------------------------------------------------

def arm_figures(run: TrainedArm, s: Settings) -> dict[str, float]:
    rows = run.metrics()
    kl = [v for v in (behaviour_kl(r) for r in rows) if v is not None]
    last = [r for r in rows if "staleness/dropped_group_share" in r]

    def need(key: str, value: float | None) -> float:
        if value is None:
            raise ValueError(f"arm {run.arm.label} seed {run.seed}: no '{key}' in its metrics "
                             "(did it run on the fleets?)")
        return value

    return {
        "behaviour_kl": need("behaviour/*", sum(kl) / len(kl) if kl else None),
        "engine_kl": mean_of(rows, "behaviour/engine_kl") or 0.0,
        "stale_kl": mean_of(rows, "behaviour/stale_kl") or 0.0,
        "stale_share": need("behaviour/stale_token_share",
                            mean_of(rows, "behaviour/stale_token_share")),
        "lag_mean": need("staleness/lag_mean", mean_of(rows, "staleness/lag_mean")),
        "dropped_share": last[-1]["staleness/dropped_group_share"] if last else 0.0,
        "step_s": need("time/step_s", mean_after(rows, "time/step_s", s.skip_steps)),
        "train_s": need("time/train_s", mean_after(rows, "time/train_s", s.skip_steps)),
        "tokens_per_s": need("fleet/generated_tokens_per_s",
                             mean_after(rows, "fleet/generated_tokens_per_s", s.skip_steps)),
        "busy_share": need("fleet/inference_busy_share",
                           mean_after(rows, "fleet/inference_busy_share", s.skip_steps)),
        "length_mean": need("length/mean", mean_of(rows, "length/mean")),
        "length_max": need("length/max", mean_of(rows, "length/max")),
        "weight_truncated": mean_of(rows, "behaviour/truncated_frac") or 0.0,
        "weight_masked": mean_of(rows, "behaviour/masked_frac") or 0.0,
    }


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    out: dict[str, dict] = {}
    for name, runs in trained.items():
        arm: dict[str, Any] = {"pass@1": [], "figures": [], "curves": {k: [] for k in CURVES},
                               "steps": {}}
        for run in runs:
            result = held_out(run.final, run.config(), seed=run.seed, budget=s)
            arm["pass@1"].append(result.pass_at[1])
            arm["figures"].append(arm_figures(run, s))
            rows = run.metrics()
            for key in CURVES:
                steps, values = series(rows, key)
                arm["curves"][key].append(values)
                arm["steps"][key] = steps
        out[name] = arm
    cfg = trained["k0"][0].config()
    k0 = {key: sum(f[key] for f in out["k0"]["figures"]) / len(out["k0"]["figures"])
          for key in ("length_mean", "length_max", "tokens_per_s", "busy_share", "train_s")}
    sim = simulator_config(k0, steps=s.steps, prompts_per_step=cfg.rollout.prompts_per_step,
                           group_size=cfg.rollout.group_size,
                           max_new_tokens=cfg.rollout.max_new_tokens, slots=cfg.rollout.slots)
    return {"seeds": list(ctx.seeds), "prompts": s.prompts, "samples": s.samples,
            "engine_dtype": s.engine_dtype, "arms": out, "simulated": predictions(sim),
            "simulator": sim.model_dump()}


# -- analysis ----------------------------------------------------------------------------

def figure(arm: dict[str, Any], key: str) -> list[float]:
    return [f[key] for f in arm["figures"]]


def step_time_notes(speed: Verdict, seeds: int, a: list[dict], b: list[dict],
                    simulated: dict) -> list[str]:
    """What the step-time verdict `speed` leaves to explain, from the per-seed figures of
    k = 0 (`a`) and k = 4 (`b`) and the simulator's prediction: why k = 4 was slower, or why
    it was not measurably faster (with the seeds to tell)."""
    if speed != "contradicts":
        return ["k = 4 did not make steps measurably faster than k = 0 here: with the worker "
                "and the trainer on one core each, the one that is slower sets the pace "
                "whatever k allows."] if speed != "supports" and seeds > 1 else []

    def avg(figures: list[dict], key: str) -> float:
        return sum(f[key] for f in figures) / len(figures)

    return [(
        f"k = 4 made steps slower, not faster ({avg(a, 'step_s'):.2f} -> "
        f"{avg(b, 'step_s'):.2f} s), where the simulator predicted "
        f"{simulated['0']['step_s']:.2f} -> {simulated['4']['step_s']:.2f} s. The worker "
        "sets the pace (the lag of trained tokens stays near 1 even when 4 is allowed, "
        "as the simulator also predicts), and it did less: its busy share fell from "
        f"{avg(a, 'busy_share'):.2f} to {avg(b, 'busy_share'):.2f} and its tokens/s over "
        f"the run from {avg(a, 'tokens_per_s'):.0f} to {avg(b, 'tokens_per_s'):.0f}, "
        "while its decode time per step went from "
        f"{avg(a, 'busy_share') * avg(a, 'step_s'):.2f} to "
        f"{avg(b, 'busy_share') * avg(b, 'step_s'):.2f} s. The rest is outside its decode "
        "calls (weight loads with rows running, the shared cores), which the simulator "
        "charges as a fixed pause.")]


def analyse(numbers: Numbers) -> Analysis:
    arms_ = numbers["arms"]
    k0, k4, mis, tis = arms_["k0"], arms_["k4"], arms_["k4_mis"], arms_["k4_tis"]
    effects = [
        Effect("KL(mu || pi_old) per trained token: k=4 - k=0",
               paired(figure(k0, "behaviour_kl"), figure(k4, "behaviour_kl")), expected_sign=+1,
               min_effect=1e-3),
        Effect("seconds per step: k=4 - k=0", paired(figure(k0, "step_s"), figure(k4, "step_s")),
               expected_sign=-1, min_effect=0.5),
        Effect("pass@1: k=4 with MIS - k=4 uncorrected", paired(k4["pass@1"], mis["pass@1"]),
               expected_sign=+1, min_effect=0.01),
        Effect("pass@1: k=4 with TIS - k=4 uncorrected", paired(k4["pass@1"], tis["pass@1"]),
               expected_sign=+1, min_effect=0.01, primary=False),
        Effect("pass@1: k=4 uncorrected - k=0", paired(k0["pass@1"], k4["pass@1"]),
               expected_sign=-1, min_effect=0.01, primary=False),
        Effect("mean lag of trained tokens (versions) at k=4: the set-up lags",
               tuple(figure(k4, "lag_mean")), expected_sign=+1, primary=False,
               min_effect=1.0),
        Effect("mean lag of trained tokens (versions): k=8 - k=4",
               paired(figure(k4, "lag_mean"), figure(arms_["k8"], "lag_mean")),
               expected_sign=+1, primary=False, min_effect=0.5),
        Effect("KL(mu || pi_old) per trained token: k=8 - k=4",
               paired(figure(k4, "behaviour_kl"), figure(arms_["k8"], "behaviour_kl")),
               expected_sign=+1, primary=False, min_effect=1e-3),
        Effect("pass@1: k=8 with MIS - k=8 uncorrected",
               paired(arms_["k8"]["pass@1"], arms_["k8_mis"]["pass@1"]), expected_sign=+1,
               primary=False, min_effect=0.01),
    ]
    simulated = numbers["simulated"]
    rows = []
    for name, arm in arms_.items():
        k = ARMS[name].k
        sim = simulated[str(k)]
        rows.append([name, str(k), ARMS[name].correction,
                     f"{cell(figure(arm, 'lag_mean'), 2)} (sim {sim['lag_mean']:.2f})",
                     cell(figure(arm, "engine_kl"), 5), cell(figure(arm, "stale_kl"), 5),
                     cell(figure(arm, "stale_share"), 2),
                     f"{cell(figure(arm, 'dropped_share'), 3)} (sim {sim['dropped_share']:.3f})",
                     f"{cell(figure(arm, 'step_s'), 2)} (sim {sim['step_s']:.2f})",
                     cell(arm["pass@1"])])
    table = Table(["arm", "k", "correction", "lag of trained tokens", "KL fresh tokens",
                   "KL lagged tokens", "lagged share", "dropped groups", "s / step",
                   "pass@1"], rows)
    notes = [
        f"Engine in {numbers['engine_dtype']}, trainer in fp32 reusing each batch 2 epochs x "
        "4 minibatches, one inference worker and the trainer on one core each. KL(mu || pi_old) is the loop's k3 estimate on the trained "
        "tokens: `behaviour/engine_kl` on tokens drawn by the weights being trained (the "
        "engine's mismatch alone), `behaviour/stale_kl` on lagged ones; means over steps. "
        f"pass@1: held-out `test`, {numbers['prompts']} prompts x {numbers['samples']} "
        "samples per model and seed. s / step: mean `time/step_s` after the first steps.",
        "(sim ...): the fleet simulator (runtime/simulator.py) fitted to the k = 0 arm's own "
        "rates (trainer seconds per token, worker tokens/s, response lengths) and run in "
        "inflight mode at each k. It models separate machines for inference and training; "
        "here they share the 2 cores, so where the measurement and the model part, the "
        "shared cores are the first suspect."]
    drift, speed, fix = (e.verdict for e in effects[:3])
    if drift == "supports" and fix != "supports" and len(numbers["seeds"]) > 1:
        notes.append("The drift grew with k, but pass@1 did not separate the corrected arm "
                     "from the uncorrected one: at this budget the drift did not cost "
                     "accuracy the seeds could see, so there was little for the correction "
                     "to recover.")
    notes += step_time_notes(speed, len(numbers["seeds"]), k0["figures"], k4["figures"],
                             simulated)
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    arms_ = numbers["arms"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for ax, key in zip((axes[0][0], axes[0][1], axes[1][0]),
                       ("staleness/lag_mean", "behaviour/stale_kl", "time/step_s"), strict=True):
        for i, (name, arm) in enumerate(arms_.items()):
            per_seed = arm["curves"][key]
            if not per_seed or not all(per_seed) or len({len(c) for c in per_seed}) != 1:
                continue  # never logged (k = 0 has no lagged tokens), or unequal lengths
            band(ax, arm["steps"][key], per_seed, name, color=f"C{i}")  # one colour per arm
        ax.set_xlabel("step")
        ax.set_title(f"{key} (mean ± SE over seeds)")
        tidy(ax)
    bars(axes[1][1], list(arms_), [arm["pass@1"] for arm in arms_.values()],
         "held-out pass@1", colored=True)
    return save_figure(fig, out)


# minutes: estimated 54 a seed (9 arms x ~6 min: the 5 arms of one update a step measured
# ~4 min each, 2026-12-03; 8 updates a step slow the learner) -- does not fit 60 min at 4 seeds
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=54)
