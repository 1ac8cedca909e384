"""On-policy distillation: the per-token teacher advantage, its mix with the verifier's,
the teacher's tokenizer check, and OPD / SFT-on-teacher-samples runs end to end."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from rlscale.config import ConfigError, load_config
from rlscale.rlvr import advantages, objectives
from rlscale.rlvr.config import RLVRConfig, SFTConfig
from rlscale.rlvr.distill import build_demonstrations, sft
from rlscale.rlvr.loop import train
from rlscale.rlvr.model import ModelLoadError, build_tiny_model, load_teacher, save_model
from rlscale.rlvr.objectives import PRESETS, Objective


def test_teacher_advantage_is_the_negative_reverse_kl_sample_per_token():
    student = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, 0.0]])
    teacher = torch.tensor([[-0.5, -3.0, -9.0], [-0.1, -1.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = advantages.teacher_advantages(student, teacher, mask)
    # log pi_T - log pi_s on each active token, each token its own; 0 on padding.
    assert torch.allclose(adv, torch.tensor([[0.5, -1.0, 0.0], [0.1, 2.0, 0.0]]))
    # k1 reverse KL: mean of log pi_s - log pi_T over the 4 active tokens.
    assert advantages.reverse_kl_per_token(student, teacher, mask) == pytest.approx(
        (-0.5 + 1.0 - 0.1 - 2.0) / 4)


def test_teacher_equal_to_student_gives_zero_advantage_and_zero_gradient():
    logp = torch.tensor([[-1.0, -2.0, -0.7], [-0.3, -1.5, -4.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    token = advantages.teacher_advantages(logp, logp.detach().clone(), mask)
    assert torch.equal(token, torch.zeros_like(token))
    o = PRESETS["opd"]
    adv = advantages.mixed_advantages(torch.tensor([0.7, -0.7]), token,
                                      reward_weight=o.reward_weight, teacher_weight=o.teacher_weight)
    out = objectives.policy_loss(objectives.LossInputs(logp, logp.detach(), adv, mask), o)
    out.loss.backward()
    assert torch.equal(logp.grad, torch.zeros_like(logp))


def test_per_token_advantages_give_each_token_its_own_gradient():
    """At theta = theta_old the clipped token loss with token-mean aggregation has gradient
    -A_{i,t} / N on each active token's log-prob (N: active tokens)."""
    logp = torch.tensor([[-1.0, -2.0, -0.7], [-0.3, -1.5, -4.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[0.5, -1.0, 2.0], [0.25, 0.0, 3.0]])
    out = objectives.policy_loss(objectives.LossInputs(logp, logp.detach(), adv, mask),
                                 Objective(aggregation="token-mean"))
    out.loss.backward()
    assert torch.allclose(logp.grad, -adv * mask / 5)


def test_mixed_advantages_weigh_the_verifier_and_the_teacher():
    sequence = torch.tensor([1.0, -1.0])
    token = torch.tensor([[0.5, -0.5], [2.0, 0.0]])
    mixed = advantages.mixed_advantages(sequence, token, reward_weight=0.25, teacher_weight=2.0)
    assert torch.allclose(mixed, torch.tensor([[1.25, -0.75], [3.75, -0.25]]))
    # No teacher: the GRPO family's [B] advantages, unchanged at weight 1.
    same = advantages.mixed_advantages(sequence, None, reward_weight=1.0, teacher_weight=0.0)
    assert same.shape == (2,) and torch.equal(same, sequence)


def test_per_token_advantages_need_token_ratios():
    with pytest.raises(ValueError, match="ratio_level 'token'"):
        replace(PRESETS["opd"], ratio_level="sequence")
    with pytest.raises(ValueError, match="ratio_level 'token'"):
        objectives.policy_loss(objectives.LossInputs(torch.zeros(2, 3), torch.zeros(2, 3),
                                                     torch.zeros(2, 3), torch.ones(2, 3)),
                               Objective(ratio_level="sequence"))
    assert PRESETS["opd"].uses_teacher and not PRESETS["grpo"].uses_teacher
    assert Objective().reward_weight == 1.0


def test_config_pairs_the_teacher_with_the_objective(tiny_model_dir):
    base = [f"model.path={tiny_model_dir}"]
    with pytest.raises(ConfigError, match="set teacher.path"):
        load_config(RLVRConfig, None, [*base, "objective=opd"])
    with pytest.raises(ConfigError, match="does not use a teacher"):
        load_config(RLVRConfig, None, [*base, f"teacher.path={tiny_model_dir}"])
    # GRPO with a teacher term: any objective can mix one in.
    cfg = load_config(RLVRConfig, None, [*base, f"teacher.path={tiny_model_dir}",
                                         "loss.teacher_weight=0.5"])
    assert cfg.resolved_objective().teacher_weight == 0.5
    opd = load_config(RLVRConfig, None, [*base, "objective=opd", f"teacher.path={tiny_model_dir}",
                                         "loss.reward_weight=0.3"])
    assert opd.resolved_objective().reward_weight == 0.3
    with pytest.raises(ConfigError, match="go together"):
        load_config(SFTConfig, None, ["init_preset=tiny", "data.source=teacher"])


def test_a_teacher_with_another_tokenizer_is_a_one_line_error(tmp_path):
    student_model, student_tok = build_tiny_model("tiny", seed=0)
    teacher, tokenizer = build_tiny_model("tiny", seed=1)
    tokenizer.add_tokens(["<think>"])
    teacher.resize_token_embeddings(len(tokenizer))
    save_model(teacher, tokenizer, tmp_path / "teacher")
    with pytest.raises(ModelLoadError) as info:
        load_teacher(tmp_path / "teacher", "float32", student_tok)
    message = str(info.value)
    assert "different tokenizer" in message and "\n" not in message
    # The same tokenizer loads, frozen.
    same, _ = build_tiny_model("tiny", seed=1)
    save_model(same, student_tok, tmp_path / "same")
    loaded = load_teacher(tmp_path / "same", "float32", student_tok)
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())


def _opd_config(tmp_path, student, teacher, *extra):
    return load_config(RLVRConfig, None, [
        f"model.path={student}", f"teacher.path={teacher}", "objective=opd",
        f"run_dir={tmp_path / 'run'}", "rollout.prompts_per_step=4", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "train.steps=2", "train.lr=1e-3", "eval.every=2",
        "eval.prompts=8", "checkpoint.every=0", "progress=false", "tensorboard=false", *extra])


def test_opd_with_the_student_as_teacher_leaves_the_weights_unchanged(tmp_path, tiny_model_dir):
    # fp32: exact identity. In bf16 (what `auto` picks on some CPUs) the weights moved: the
    # teacher's forward and the student's passes (sampler decode, trainer attention) take
    # different kernels, which round differently in bf16.
    final = train(_opd_config(tmp_path, tiny_model_dir, tiny_model_dir,
                              "train.compute_dtype=float32"))
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(final / "model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(row["opd/reverse_kl"] == 0.0 for row in rows)
    assert rows[-1]["eval/teacher_pass@1"] == rows[-1]["eval/pass@1"]


def test_opd_moves_the_student_towards_another_teacher(tmp_path, tiny_model_dir):
    teacher, tokenizer = build_tiny_model("tiny", seed=1)
    save_model(teacher, tokenizer, tmp_path / "teacher")
    final = train(_opd_config(tmp_path, tiny_model_dir, tmp_path / "teacher",
                              "loss.reward_weight=0.5"))
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(final / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(row["opd/reverse_kl"] > 0 for row in rows)  # two different random models
    assert {"opd/teacher_logp_mean", "time/teacher_s", "reward/mean"} <= set(rows[0])
    assert "eval/teacher_pass@1" in rows[-1]


def test_sft_on_teacher_samples_trains_on_what_the_teacher_wrote(tmp_path, tiny_model_dir):
    args = ["init_preset=tiny", f"out={tmp_path / 'run' / 'model'}", f"run_dir={tmp_path / 'run'}",
            "data.source=teacher", f"teacher.path={tiny_model_dir}", "data.examples=16",
            "data.max_new_tokens=5", "steps=2", "batch_size=8", "warmup_steps=0",
            "progress=false", "tensorboard=false"]
    cfg = load_config(SFTConfig, None, args)
    _, tokenizer = build_tiny_model("tiny", seed=0)
    pairs = build_demonstrations(cfg, tokenizer)
    assert len(pairs) == 16
    assert all(1 <= len(target) <= 5 for _, target in pairs)
    # A random-init teacher writes noise, not the task's answers: these are its samples.
    demos = build_demonstrations(load_config(SFTConfig, None, args[:3] + ["data.examples=16"]),
                                 tokenizer)
    assert [t for _, t in pairs] != [t for _, t in demos]
    assert (sft(cfg) / "config.json").is_file()
