"""Tool use: RL learns to call a calculator where it pays (docs/tools.md).

Two SFT bases of the same budget: the shared one, and one whose demonstrations hand each
arithmetic step to the calculator at random (task option `tool_share`, whatever the
difficulty: the call and the calculator's exact result, `<c>432-96</c><r>336</r>`). GRPO runs
the same steps from each: without tools from the shared base, and with `rollout.tools:
[calculator]` from the tool base (a call stops generation, the calculator runs in a worker
process, its result is written into the context and masked out of the loss). Every model is
measured on the same held-out prompts by difficulty (the number of terms; a trace of n terms
has n - 1 operations): pass@1, tool calls per rollout and the share of the operations handed
to the calculator; the tool model once more with the calculator taken away.

The hard part is the top two fifths of the difficulty levels (5-6 terms on the reasoning
task). The demonstrator slips on a tenth of the steps it computes itself and never on a
calculator's, so the calls pay most where a trace has many steps.
"""

from __future__ import annotations

from pathlib import Path

from .measure import by_level, held_out
from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, BaseVariant, Context, TrainedArm, series
from .spec import Experiment, HeldOutBudget, Numbers
from .stats import cell, curve, mean, paired
from .verdict import Effect

NAME = "tool_use"
CLAIM = ("RL learns to use a tool: from demonstrations that call a calculator at random, GRPO "
         "with the calculator beats the same budget without it by at least 10 points of pass@1 "
         "on the hard prompts, and the calls it adds go to the hard prompts.")
TOOL_SHARE = 0.3    # configs/rlvr/reasoning_tools_sft.yaml's
TOOL_BASE = BaseVariant("tools", (("tool_share", TOOL_SHARE),))
TOOLS = ("rollout.tools.tools=[calculator]", "rollout.tools.max_tool_calls=8",
         "rollout.tools.deadline_s=2.0")
MIN_HARD_GAIN = 0.10    # the target: >= 10 points on the hard part
CALLS = "tools/calls_per_rollout"
SETUP = ("Two SFT bases of configs/rlvr/reasoning_sft.yaml's budget, one with demonstrations "
         f"that hand each step to the calculator with probability {TOOL_SHARE} (task option "
         "tool_share, built in OUT/base-tools); GRPO (configs/rlvr/reasoning.yaml) the same "
         "steps and seeds from each, without tools and with rollout.tools [calculator]; "
         "every model's held-out pass@1 and tool calls by difficulty, the tool model also "
         "with the calculator taken away.")
# prompts: held-out prompts for every model
SETTINGS = {"quick": HeldOutBudget(steps=4, prompts=32, samples=2),
            "full": HeldOutBudget(steps=100, prompts=400, samples=2)}


def arms(scale: str) -> list[Arm]:
    steps = f"train.steps={SETTINGS[scale].steps}"
    return [Arm("no_tools", (steps,)), Arm("tools", (steps, *TOOLS), base=TOOL_BASE)]


def model_figures(path: Path, cfg, seed: int, s: HeldOutBudget, *, tools: bool) -> dict:
    result = held_out(path, cfg, seed=seed, budget=s, tools=tools)
    return {"pass@1": result.pass_at[1],
            "accuracy": by_level(result.details, "accuracy"),
            "share": by_level(result.details, "share"),
            "calls": by_level(result.details, "tool_calls"),
            "calls_per_rollout": result.details.get(CALLS, 0.0)}


MODELS = ("base", "base_tools", "grpo", "grpo_tools", "grpo_tools_removed")


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    out: dict[str, list[dict]] = {m: [] for m in MODELS}
    curves: dict[str, list] = {"steps": [], "calls": []}
    for plain, tooled in zip(trained["no_tools"], trained["tools"], strict=True):
        seed = plain.seed
        out["base"].append(model_figures(plain.base, plain.config(), seed, s, tools=False))
        out["base_tools"].append(model_figures(tooled.base, tooled.config(), seed, s, tools=True))
        out["grpo"].append(model_figures(plain.final, plain.config(), seed, s, tools=False))
        out["grpo_tools"].append(model_figures(tooled.final, tooled.config(), seed, s,
                                               tools=True))
        out["grpo_tools_removed"].append(model_figures(tooled.final, tooled.config(), seed, s,
                                                       tools=False))
        steps, calls = series(tooled.metrics(), CALLS)
        curves["steps"] = steps
        curves["calls"].append(calls)
    return {"seeds": list(ctx.seeds), "steps": s.steps, "prompts": s.prompts,
            "samples": s.samples, "models": out, "curves": curves}


def levels(numbers: Numbers) -> list[str]:
    found = {level for figures in numbers["models"]["base"] for level in figures["accuracy"]}
    return sorted(found, key=int)


def hard_levels(all_levels: list[str]) -> list[str]:
    """The top two fifths of the difficulty levels (at least one)."""
    return all_levels[len(all_levels) - max(1, round(0.4 * len(all_levels))):]


def easy_levels(all_levels: list[str]) -> list[str]:
    """The bottom two fifths (at least one)."""
    return all_levels[:max(1, round(0.4 * len(all_levels)))]


def part_accuracy(figures: dict, part: list[str]) -> float:
    """pass@1 over the prompts whose level is in `part` (levels weighted by their share)."""
    weights = [figures["share"].get(level, 0.0) for level in part]
    total = sum(weights)
    if total == 0:
        return 0.0
    return sum(figures["accuracy"].get(level, 0.0) * w for level, w in zip(part, weights,
                                                                          strict=True)) / total


def call_share(figures: dict, level: str) -> float:
    """The share of a trace's operations handed to the calculator at `level` (a level is a
    number of terms: level - 1 operations; a call may cover two of them, so it can pass 1)."""
    return figures["calls"].get(level, 0.0) / max(int(level) - 1, 1)


def part_call_share(figures: dict, part: list[str]) -> float:
    return mean([call_share(figures, level) for level in part])


def analyse(numbers: Numbers) -> Analysis:
    m = numbers["models"]
    all_levels = levels(numbers)
    hard, easy = hard_levels(all_levels), easy_levels(all_levels)
    span = f"{hard[0]}-{hard[-1]}" if len(hard) > 1 else hard[0]

    def per_seed(model: str, fn) -> list[float]:
        return [fn(f) for f in m[model]]

    hard_acc = {k: per_seed(k, lambda f: part_accuracy(f, hard)) for k in MODELS}
    easy_acc = {k: per_seed(k, lambda f: part_accuracy(f, easy)) for k in MODELS}
    shift = [(part_call_share(after, hard) - part_call_share(before, hard))
             - (part_call_share(after, easy) - part_call_share(before, easy))
             for before, after in zip(m["base_tools"], m["grpo_tools"], strict=True)]
    effects = [
        Effect(f"pass@1 on hard prompts ({span} terms) after GRPO: with tools - without",
               paired(hard_acc["grpo"], hard_acc["grpo_tools"]), expected_sign=+1,
               min_effect=MIN_HARD_GAIN),
        Effect("share of operations called, change from base to GRPO: hard - easy prompts",
               tuple(shift), expected_sign=+1, primary=False, min_effect=0.02),
        Effect("pass@1 (all prompts) after GRPO: with tools - without",
               paired(per_seed("grpo", lambda f: f["pass@1"]),
                      per_seed("grpo_tools", lambda f: f["pass@1"])),
               expected_sign=+1, primary=False, min_effect=0.01),
        Effect("pass@1 of the tool model: calculator taken away - with it",
               paired(per_seed("grpo_tools", lambda f: f["pass@1"]),
                      per_seed("grpo_tools_removed", lambda f: f["pass@1"])),
               expected_sign=-1, primary=False, min_effect=0.01),
    ]
    names = {"base": "base (SFT)", "base_tools": "tool base (SFT), calculator",
             "grpo": "GRPO, no tools", "grpo_tools": "GRPO, calculator",
             "grpo_tools_removed": "GRPO, calculator, then taken away"}
    rows = []
    for key in MODELS:
        tooled = key in ("base_tools", "grpo_tools")
        rows.append([names[key], cell(per_seed(key, lambda f: f["pass@1"])),
                     cell(easy_acc[key]), cell(hard_acc[key]),
                     cell(per_seed(key, lambda f: f["calls_per_rollout"]), 2) if tooled else "-",
                     cell(per_seed(key, lambda f: part_call_share(f, easy)), 2) if tooled else "-",
                     cell(per_seed(key, lambda f: part_call_share(f, hard)), 2) if tooled else "-"])
    easy_span = f"{easy[0]}-{easy[-1]}" if len(easy) > 1 else easy[0]
    table = Table(["model", "pass@1", f"pass@1 easy ({easy_span} terms)",
                   f"pass@1 hard ({span} terms)", "calls per rollout",
                   "operations called, easy", "operations called, hard"], rows)
    notes = [f"held-out `test`: {numbers['prompts']} prompts x {numbers['samples']} samples per "
             f"model and seed at temperature 1; both arms {numbers['steps']} GRPO steps from "
             "SFT bases of the same budget. `operations called`: calls per rollout divided by "
             "the trace's operations (terms - 1), per level, averaged over the part's levels.",
             "The calculator costs the policy nothing but the tokens of the call, so nothing "
             "in the reward holds calls back on easy prompts: the table says where they went."]
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    m, c = numbers["models"], numbers["curves"]
    all_levels = levels(numbers)
    x = [int(level) for level in all_levels]
    n = len(numbers["seeds"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    styles = {"base": ("base (SFT)", "C0", "--"), "grpo": ("GRPO, no tools", "C0", "-"),
              "base_tools": ("tool base, calculator", "C1", "--"),
              "grpo_tools": ("GRPO, calculator", "C1", "-"),
              "grpo_tools_removed": ("GRPO, calculator taken away", "C2", ":")}
    for key, (label, colour, line) in styles.items():
        acc, se = curve([[m[key][i]["accuracy"].get(level, 0.0) for level in all_levels]
                         for i in range(n)])
        axes[0].errorbar(x, acc, yerr=se, marker="o", capsize=3, color=colour, linestyle=line,
                         label=label)
    for key in ("base_tools", "grpo_tools"):
        label, colour, line = styles[key]
        share, se = curve([[call_share(m[key][i], level) for level in all_levels]
                           for i in range(n)])
        axes[1].errorbar(x, share, yerr=se, marker="o", capsize=3, color=colour,
                         linestyle=line, label=label)
    if c["steps"]:
        band(axes[2], c["steps"], c["calls"], "calls per rollout (training)")
    axes[0].set_title("held-out pass@1 by difficulty")
    axes[1].set_title("share of operations handed to the calculator")
    axes[2].set_title("tool calls per rollout over GRPO steps (mean ± SE)")
    for ax in axes[:2]:
        ax.set_xlabel("terms (difficulty)")
    axes[2].set_xlabel("training step")
    tidy(*axes)
    return save_figure(fig, out)


# minutes: 2 seeds x 100 steps without (~1.3 s) and with tools + 10 evaluations
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=7)
