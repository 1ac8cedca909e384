"""`rlscale experiments`: the verdict can say all three things, every experiment's analysis
can too (on synthetic numbers), every experiment runs in quick mode through the library's
loop and leaves a figure and a verdict, and `report` writes the markdown."""

import dataclasses
import json
import time

import pytest
from typer.testing import CliRunner

from rlscale.cli import app
from rlscale.experiments import clipping, kl_anchor, pass_at_k
from rlscale.experiments.record import FIGURE_NAME, load_result
from rlscale.experiments.registry import EXPERIMENTS
from rlscale.experiments.report import write_report
from rlscale.experiments.runner import command, run_experiment
from rlscale.experiments.setup import QUICK, Context, base_model, train_arm
from rlscale.experiments.verdict import (
    VERDICTS,
    Effect,
    estimate,
    experiment_verdict,
    judge,
    overall,
)
from rlscale.rlvr import objectives
from rlscale.runtime.rundir import RunDirError

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


# -- the verdict, on synthetic numbers -----------------------------------------------------

def test_estimate_is_the_mean_and_its_standard_error():
    est = estimate([1.0, 2.0, 3.0])
    assert est.mean == 2.0 and est.n == 3
    assert est.se == pytest.approx(1.0 / 3 ** 0.5)  # sd 1, n 3
    assert estimate([0.5]).se is None
    with pytest.raises(ValueError):
        estimate([])
    with pytest.raises(ValueError):
        estimate([float("nan"), 1.0])


def test_judge_gives_all_three_outcomes():
    clear_rise = estimate([0.10, 0.12, 0.11, 0.13])
    assert judge(clear_rise, +1) == "supports"
    assert judge(clear_rise, -1) == "contradicts"
    noisy = estimate([0.10, -0.08, 0.05, -0.04])    # |mean| well inside 2 SE
    assert judge(noisy, +1) == "inconclusive"
    assert judge(noisy, -1) == "inconclusive"
    assert judge(estimate([0.5]), +1) == "inconclusive"        # one seed: no spread
    assert judge(estimate([0.0, 0.0]), +1) == "inconclusive"   # no effect at all
    # an effect clear of 2 SE but below the stated minimum is not evidence either way
    tiny = estimate([0.001, 0.0011, 0.0012])
    assert judge(tiny, +1) == "supports"
    assert judge(tiny, +1, min_effect=0.01) == "inconclusive"
    # exactly at the boundary: 2 SE away counts
    assert judge(dataclasses.replace(clear_rise, mean=0.2, se=0.1), +1) == "supports"
    assert judge(dataclasses.replace(clear_rise, mean=0.19, se=0.1), +1) == "inconclusive"
    with pytest.raises(ValueError):
        judge(clear_rise, 0)


def test_overall_is_contradicted_by_any_and_supported_by_all():
    assert overall(["supports", "supports"]) == "supports"
    assert overall(["supports", "inconclusive"]) == "inconclusive"
    assert overall(["supports", "contradicts"]) == "contradicts"
    assert overall(["inconclusive", "contradicts"]) == "contradicts"
    with pytest.raises(ValueError):
        overall([])
    effects = [Effect("a", (0.1, 0.11, 0.12), +1),
               Effect("b", (-0.1, -0.11, -0.12), +1, primary=False)]  # reported, not counted
    assert experiment_verdict(effects) == "supports"
    round_trip = Effect.from_dict(json.loads(json.dumps(effects[1].as_dict())))
    assert round_trip == effects[1] and round_trip.verdict == "contradicts"


# -- each experiment's analysis, on synthetic numbers --------------------------------------

SEEDS = [0, 1, 2]
JITTER = (-0.004, 0.0, 0.004)  # per seed: a spread small against the effects below


def per_seed(values, jitter=JITTER):
    """The same curve for each seed, shifted by that seed's jitter."""
    if isinstance(values, int | float):
        return [values + j for j in jitter]
    return [[v + j for v in values] for j in jitter]


def pass_at_k_numbers(base, grpo, jitter=JITTER):
    curves = {"base": {s: per_seed(base, (0,) * 3) for s in pass_at_k.SPLITS},
              "grpo": {s: per_seed(grpo, jitter) for s in pass_at_k.SPLITS}}
    return {"ks": [1, 2, 4, 8], "seeds": SEEDS, "prompts": 10, "samples": 8,
            "pass_at_k": curves}


def kl_anchor_numbers(kl, entropy, jitter=JITTER):
    """kl, entropy: the figures at beta 0, 0.04, 0.2; `jitter` on the last arm's."""
    arms = {"base": {"pass@1": per_seed(0.3), "ungrammatical": per_seed(0.0),
                     "kl_to_reference": per_seed(0.0), "entropy": per_seed(0.5)}}
    for beta, k, e in zip(kl_anchor.BETAS, kl, entropy, strict=True):
        shift = jitter if beta == kl_anchor.BETAS[-1] else (0.0,) * 3
        arms[kl_anchor.label(beta)] = {
            "pass@1": per_seed(0.5), "ungrammatical": per_seed(0.02),
            "kl_to_reference": per_seed(k, shift), "entropy": per_seed(e, shift),
            "entropy_curve": per_seed([0.5, 0.4, e], shift), "steps": [1, 2, 3]}
    return {"betas": list(kl_anchor.BETAS), "seeds": SEEDS, "prompts": 10, "samples": 4,
            "arms": arms}


def clipping_numbers(kl, pass1, jitter=JITTER):
    """kl, pass1: (clip, no clip); `jitter` on the clipped arm's."""
    arms = {}
    for name, k, p in zip(clipping.ARMS, kl, pass1, strict=True):
        shift = jitter if name == "clip" else (0.0,) * 3
        means = {"policy/kl_new_old": per_seed(k, shift), "clip/frac": per_seed(0.01),
                 "ratio/max": per_seed(1.5 + 10 * k), "policy/entropy": per_seed(0.3)}
        arms[name] = {"pass@1": per_seed(p, shift), "means": means,
                      "curves": {key: [[v, v] for v in values] for key, values in means.items()},
                      "steps": {key: [1, 2] for key in means}}
    return {"seeds": SEEDS, "prompts": 10, "samples": 4, "arms": arms}


NOISE = (-0.4, 0.3, 0.1)  # per seed: a spread that swamps the effects (SE 0.21)

SYNTHETIC = {
    "pass_at_k": (pass_at_k, {
        # GRPO wins at k = 1, the base catches up and passes it: the curves cross
        "supports": pass_at_k_numbers([0.2, 0.35, 0.55, 0.8], [0.5, 0.6, 0.65, 0.7]),
        # GRPO above the base at every k
        "contradicts": pass_at_k_numbers([0.2, 0.35, 0.55, 0.7], [0.5, 0.7, 0.85, 0.95]),
        "inconclusive": pass_at_k_numbers([0.2, 0.35, 0.55, 0.8], [0.5, 0.6, 0.65, 0.7],
                                          NOISE)}),
    "kl_anchor": (kl_anchor, {
        "supports": kl_anchor_numbers([0.10, 0.05, 0.02], [0.20, 0.25, 0.30]),
        "contradicts": kl_anchor_numbers([0.02, 0.05, 0.10], [0.30, 0.25, 0.20]),
        "inconclusive": kl_anchor_numbers([0.10, 0.05, 0.02], [0.20, 0.25, 0.30], NOISE)}),
    "clipping": (clipping, {
        "supports": clipping_numbers([0.01, 0.2], [0.5, 0.3]),
        "contradicts": clipping_numbers([0.2, 0.01], [0.3, 0.5]),
        "inconclusive": clipping_numbers([0.01, 0.2], [0.5, 0.3], NOISE)}),
}


@pytest.mark.parametrize("name", list(SYNTHETIC))
def test_each_analysis_gives_all_three_verdicts(name, tmp_path):
    module, cases = SYNTHETIC[name]
    for expected, numbers in cases.items():
        analysis = module.analyse(numbers)
        assert experiment_verdict(analysis.effects) == expected, (name, expected, [
            (e.name, e.per_seed, e.verdict) for e in analysis.effects])
        assert analysis.table.rows and all(len(r) == len(analysis.table.columns)
                                           for r in analysis.table.rows)
    module.plot(cases["supports"], tmp_path / "figure.png")  # three seeds: bands and error bars
    assert (tmp_path / "figure.png").read_bytes().startswith(PNG)


def test_pass_at_k_crossing():
    ks = [1, 2, 4, 8]
    assert pass_at_k.crossing(ks, [0.2, 0.4, 0.6, 0.9], [0.5, 0.6, 0.65, 0.8]) == 8
    assert pass_at_k.crossing(ks, [0.2, 0.4, 0.6, 0.7], [0.5, 0.6, 0.65, 0.8]) is None
    assert pass_at_k.crossing(ks, [0.5, 0.6, 0.7, 0.9], [0.4, 0.6, 0.7, 0.9]) is None  # never led
    assert pass_at_k.ks_up_to(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert pass_at_k.ks_up_to(48) == (1, 2, 4, 8, 16, 32)


# -- the loop's figure the clipping experiment reads ----------------------------------------

def test_post_update_kl_is_kl_of_old_to_new_on_old_samples(tiny_model_dir):
    """`policy/kl_new_old`: with samples from pi_old, k3 with the ratio new/old estimates
    KL(old || new). One token whose old probability was twice the new one gives
    1/2 - 1 - log(1/2) = 0.193 nats, not 2 - 1 - log 2 = 0.307 (the ratio the wrong way)."""
    import math

    import torch

    from rlscale.rlvr.model import load_model
    from rlscale.rlvr.trainer import PolicyTrainer, StepResult, build_policy_batch

    model, _ = load_model(tiny_model_dir)
    trainer = PolicyTrainer(model, None, objectives.PRESETS["grpo"], lr=1e-3, weight_decay=0.0,
                            warmup_steps=0, grad_clip=1.0, minibatches=1, epochs=1,
                            micro_batch_size=0, temperature=1.0)
    mask = torch.zeros(2, 3)
    mask[0, 0] = 1.0
    batch = build_policy_batch([[5, 6], [7, 8]], torch.tensor([[9, 10, 11], [12, 13, 14]]), mask,
                               torch.zeros(2), torch.zeros(2, 3), pad_token_id=0, policy_version=0)
    now = trainer.score_logprobs(model, batch)
    before = StepResult({}, now + math.log(2.0), torch.zeros_like(mask))
    stats = trainer.update_stats(batch, before)
    assert stats["policy/kl_new_old"] == pytest.approx(0.5 - 1 - math.log(0.5), rel=1e-4)


# -- the command line ------------------------------------------------------------------------

def test_list_shows_every_experiment_with_its_claim():
    result = CliRunner().invoke(app, ["experiments", "list"])
    assert result.exit_code == 0, result.output
    for name, experiment in EXPERIMENTS.items():
        assert name in result.stdout
        assert experiment.claim in result.stdout
    assert {"pass_at_k", "kl_anchor", "clipping"} <= set(EXPERIMENTS)


def test_run_refuses_an_unknown_experiment_in_one_line():
    result = CliRunner().invoke(app, ["experiments", "run", "no_such_claim", "--quick"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: unknown experiment 'no_such_claim'")


def test_command_names_relative_paths_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert command("clipping", quick=True, seeds=1, out=tmp_path / "runs/experiments-quick",
                   base=None) == "rlscale experiments run clipping --quick"
    assert command("kl_anchor", quick=False, seeds=3, out=tmp_path / "elsewhere",
                   base=tmp_path / "runs/reasoning/base") == (
        "rlscale experiments run kl_anchor --seeds 3 --out elsewhere --base runs/reasoning/base")
    outside = command("kl_anchor", quick=False, seeds=2, out=tmp_path.parent / "x", base=None)
    assert outside == "rlscale experiments run kl_anchor"


# -- every experiment in quick mode, through the library's loop ----------------------------

@pytest.fixture(scope="module")
def experiments_root(tmp_path_factory):
    """One experiments folder with its quick base model, shared by the quick runs."""
    root = tmp_path_factory.mktemp("experiments")
    t0 = time.perf_counter()
    base_model(root, QUICK, progress=False)
    print(f"quick base model: {time.perf_counter() - t0:.0f}s")
    return root


def test_a_base_built_with_another_config_is_refused(experiments_root):
    other = dataclasses.replace(QUICK, sft=(*QUICK.sft, "lr=1e-3"))
    with pytest.raises(RunDirError, match="another config"):
        base_model(experiments_root, other, progress=False)
    assert base_model(experiments_root, QUICK, progress=False) == experiments_root / "base" / "model"


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_each_experiment_runs_quick_with_a_figure_and_a_verdict(name, experiments_root):
    t0 = time.perf_counter()
    result = run_experiment(name, quick=True, out=experiments_root, progress=False)
    seconds = time.perf_counter() - t0
    print(f"{name} quick: {seconds:.0f}s, verdict {result.verdict}")
    folder = experiments_root / name
    assert (folder / FIGURE_NAME).read_bytes().startswith(PNG)
    saved = load_result(folder)
    assert saved == result
    assert saved.verdict in VERDICTS and saved.budget == "quick" and saved.seeds == [0]
    assert any(e.primary for e in saved.analysis.effects)
    assert all(len(e.per_seed) == 1 for e in saved.analysis.effects)
    assert saved.verdict == "inconclusive"  # one seed never decides
    assert saved.command.startswith(f"rlscale experiments run {name} --quick")
    for arm in saved.arms:  # trained by the library's loop: its run directory and metrics
        assert (folder / arm.run_dir / "final" / "config.json").is_file()
        assert (folder / arm.run_dir / "metrics.jsonl").is_file()
    assert json.loads((folder / "measurements.json").read_text())["seeds"] == [0]


def test_a_rerun_reuses_finished_arms(experiments_root):
    if load_result(experiments_root / "clipping") is None:
        run_experiment("clipping", quick=True, out=experiments_root, progress=False)
    metrics = experiments_root / "clipping" / "arms" / "clip_s0" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    result = run_experiment("clipping", quick=True, out=experiments_root, progress=False)
    assert metrics.stat().st_mtime_ns == before
    assert load_result(experiments_root / "clipping") == result
    # an arm changed since it was trained is refused, with the experiments' own flags
    ctx = Context(out=experiments_root / "clipping", scale=QUICK, seeds=(0,),
                  base=experiments_root / "base" / "model", progress=False)
    changed = clipping.arms("quick")[0]
    changed = dataclasses.replace(changed, overrides=(*changed.overrides, "train.lr=2e-4"))
    with pytest.raises(RunDirError, match="cannot be reused.*train.lr.*--overwrite"):
        train_arm(ctx, changed, 0)
    assert metrics.stat().st_mtime_ns == before


def test_report_writes_every_experiment(experiments_root, tmp_path):
    for name in EXPERIMENTS:
        if load_result(experiments_root / name) is None:
            run_experiment(name, quick=True, out=experiments_root, progress=False)
    out = tmp_path / "docs" / "experiments.md"
    result = CliRunner().invoke(app, ["experiments", "report", "--runs", str(experiments_root),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    for name, experiment in EXPERIMENTS.items():
        saved = load_result(experiments_root / name)
        assert f"## {name}" in text and experiment.claim in text
        assert f"**Verdict: {saved.verdict}**" in text
        assert f"![{name}](experiments/{name}.png)" in text
        assert (out.parent / "experiments" / f"{name}.png").read_bytes().startswith(PNG)
        assert saved.command in text
        assert saved.analysis.table.columns[0] in text
    assert "Quick budget" in text
    assert str(tmp_path) not in text and str(experiments_root) not in text  # relative paths only


def test_report_lists_unmeasured_experiments_with_their_command(tmp_path):
    out = write_report(tmp_path / "nothing", tmp_path / "experiments.md")
    text = out.read_text()
    for name in EXPERIMENTS:
        assert f"rlscale experiments run {name}\n" in text
    assert text.count("Not measured yet") == len(EXPERIMENTS)
