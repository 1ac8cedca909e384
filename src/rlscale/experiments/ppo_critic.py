"""Why the critic is the problem: PPO with a learned value model against GRPO's group
baseline, at equal generated tokens, on the reasoning task's sparse terminal reward.

PPO (objective `ppo`, rlvr/critic.py) samples one completion per prompt and learns a value
model, a copy of the policy's decoder with a scalar head, by regression to the returns;
GAE with gamma = lambda = 1 makes each token's advantage `R - V(s_t)`. GRPO samples G = 8
completions per prompt and needs no second model: the group's mean reward is the baseline.
Both arms train on 128 completions a step (PPO 128 prompts x 1, GRPO 16 x 8), from the same
base and seeds. Measured: held-out pass@1 of the final models and the loop's eval curve
against steps and wall time; seconds per step; the learner's state (weights, gradients and
AdamW moments: the critic doubles it); and the critic's error along the trace, the mean
|V(s_t) - R| in the first, middle and last third of each completion, before each update.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .measure import curve_start, held_out
from .plots import band, pass1_curves, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm, mean_of, series
from .spec import Experiment, Numbers, grpo_arms
from .stats import cell, paired
from .verdict import Effect

NAME = "ppo_critic"
CLAIM = ("Under a sparse terminal reward a learned critic does not pay for itself: at equal "
         "generated tokens GRPO's group baseline reaches at least PPO's pass@1 without a "
         "second model, while PPO's value model costs time each step and predicts the reward "
         "worst at the start of the trace, where the credit it should assign is decided.")
ARMS = {"grpo": (), "ppo": ("objective=ppo", "rollout.group_size=1")}
EVAL = "eval/pass@1"
THIRDS = ("first", "middle", "last")
# AdamW keeps weights, gradients and two moments: 4 fp32 numbers a parameter.
STATE_BYTES_PER_PARAMETER = 16


@dataclass(frozen=True)
class Settings:
    steps: int
    eval_every: int      # the loop's held-out eval (eval.every); divides steps
    eval_prompts: int
    eval_samples: int
    prompts: int         # the final models' held-out pass@1
    samples: int
    completions: int     # per step, both arms


SETUP = ("From the SFT base, GRPO (configs/rlvr/reasoning.yaml: 16 prompts x 8 completions a "
         "step, no KL) against PPO with a learned critic (objective ppo: a value model copied "
         "from the policy's decoder, GAE with gamma = lambda = 1, value clipping 0.2, "
         "whitened advantages) on 128 prompts x 1, the same 128 completions a step and "
         "seeds; held-out pass@1, the loop's eval against steps and wall time, seconds a "
         "step, the learner's state and the critic's error by third of the trace.")
SETTINGS = {"quick": Settings(steps=4, eval_every=2, eval_prompts=16, eval_samples=2,
                              prompts=32, samples=4, completions=32),
            "full": Settings(steps=80, eval_every=10, eval_prompts=200, eval_samples=2,
                             prompts=400, samples=4, completions=128)}


def arms(scale: str) -> list[Arm]:
    s = SETTINGS[scale]
    own = {"grpo": (f"rollout.prompts_per_step={s.completions // 8}", "rollout.group_size=8"),
           "ppo": (*ARMS["ppo"], f"rollout.prompts_per_step={s.completions}")}
    return grpo_arms(s.steps, own, f"eval.every={s.eval_every}",
                     f"eval.prompts={s.eval_prompts}", f"eval.samples={s.eval_samples}",
                     "loss.kl_coef=0")


def learner_parameters(run: TrainedArm) -> int:
    """The parameters the learner trains: the policy's, and with a critic its decoder's
    copy and head again."""
    from ..rlvr.critic import ValueModel
    from ..rlvr.model import count_parameters, load_model

    model, _ = load_model(run.final)
    total = count_parameters(model)
    if run.config().resolved_objective().critic:
        total += count_parameters(ValueModel(model))
    return total


def _eval_curve(rows: list[dict], base_pass1: float) -> dict[str, list[float]]:
    steps, pass1 = series(rows, EVAL)
    step_s = dict(zip(*series(rows, "time/step_s"), strict=True))
    elapsed, clock = [], 0.0
    for step in range(1, (steps[-1] if steps else 0) + 1):
        clock += step_s.get(step, 0.0)
        if step in steps:
            elapsed.append(clock)
    return {"steps": [0, *steps], "seconds": [0.0, *elapsed], "pass@1": [base_pass1, *pass1]}


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    first = trained["grpo"][0].config()
    base_pass1 = curve_start(ctx.base, first)
    out: dict[str, dict] = {}
    for name in ARMS:
        arm: dict = {"pass@1": [], "curves": [], "seconds_per_step": [], "state_gib": [],
                     **{f"value_error_{t}": [] for t in THIRDS}, "explained_variance": []}
        for run in trained[name]:
            rows = run.metrics()
            arm["pass@1"].append(held_out(run.final, run.config(), seed=run.seed,
                                          budget=s).pass_at[1])
            arm["curves"].append(_eval_curve(rows, base_pass1))
            arm["seconds_per_step"].append(mean_of(rows, "time/step_s"))
            arm["state_gib"].append(learner_parameters(run) * STATE_BYTES_PER_PARAMETER / 2**30)
            for t in THIRDS:
                arm[f"value_error_{t}"].append(mean_of(rows, f"critic/value_error_{t}_third"))
            arm["explained_variance"].append(mean_of(rows, "critic/explained_variance"))
        out[name] = arm
    return {"seeds": list(ctx.seeds), "steps": s.steps, "prompts": s.prompts,
            "samples": s.samples, "completions": s.completions, "base_pass@1": base_pass1,
            "arms": out}


def analyse(numbers: Numbers) -> Analysis:
    grpo, ppo = numbers["arms"]["grpo"], numbers["arms"]["ppo"]
    slower = [p / g - 1.0 for g, p in zip(grpo["seconds_per_step"], ppo["seconds_per_step"],
                                          strict=True)]
    effects = [
        Effect(f"pass@1 after {numbers['steps']} steps: GRPO - PPO",
               paired(ppo["pass@1"], grpo["pass@1"]), expected_sign=+1, min_effect=0.02),
        Effect("seconds per step: PPO / GRPO - 1", tuple(slower), expected_sign=+1,
               min_effect=0.1),
        Effect("critic error |V - R|: first third - last third of the trace",
               paired(ppo["value_error_last"], ppo["value_error_first"]), expected_sign=+1,
               primary=False, min_effect=0.02),
        Effect("learner state: PPO / GRPO - 1",
               tuple(p / g - 1.0 for g, p in zip(grpo["state_gib"], ppo["state_gib"],
                                                 strict=True)),
               expected_sign=+1, primary=False, min_effect=0.1),
    ]
    rows = [[name, cell(arm["pass@1"]), cell([c["pass@1"][-1] for c in arm["curves"]]),
             cell(arm["seconds_per_step"], 2), cell(arm["state_gib"], 4),
             *(cell(arm[f"value_error_{t}"], 3) if name == "ppo" else "-" for t in THIRDS),
             cell(arm["explained_variance"], 3) if name == "ppo" else "-"]
            for name, arm in (("grpo", grpo), ("ppo", ppo))]
    table = Table(["objective", "pass@1 (final)", "eval pass@1 (last)", "seconds per step",
                   "learner state (GiB)", "critic error, first third",
                   "critic error, middle third", "critic error, last third",
                   "critic explained variance"], rows)
    notes = [f"Both arms: {numbers['completions']} completions a step for {numbers['steps']} "
             f"steps (equal generated tokens up to length differences). Final pass@1: "
             f"held-out `test`, {numbers['prompts']} prompts x {numbers['samples']} samples "
             f"per model and seed; the base: {numbers['base_pass@1']:.3f}. The critic's "
             "error is measured on each step's batch before its update (the values GAE "
             "used), averaged over the run; the learner state counts fp32 weights, gradients "
             "and AdamW's two moments."]
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    pass1_curves(axes[0], axes[1], {name: arm["curves"] for name, arm in numbers["arms"].items()},
                 "seconds", "training wall time (s)")
    ppo = numbers["arms"]["ppo"]
    band(axes[2], [1, 2, 3], [[ppo[f"value_error_{t}"][k] for t in THIRDS]
                              for k in range(len(numbers["seeds"]))], "PPO's critic",
         marker="o")
    axes[2].set_xticks([1, 2, 3], ["first", "middle", "last"])
    axes[2].set_xlabel("third of the completion")
    axes[2].set_ylabel("mean |V(s_t) - R|")
    axes[2].set_title("the critic's error along the trace")
    tidy(*axes)
    return save_figure(fig, out)


# minutes: measured 30.8 for 4 seeds with the shared SFT base (~4 min), one thread, the
# other core busy (2026-12-05): ~6.7 a seed
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=6.7)
