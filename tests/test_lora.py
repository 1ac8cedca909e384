"""LoRA through peft: the reference by disabled adapters, what trains, what is saved, resume."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from rlscale.config import ConfigError, load_config  # noqa: E402
from rlscale.rlvr import objectives  # noqa: E402
from rlscale.rlvr.batch import build_policy_batch  # noqa: E402
from rlscale.rlvr.config import (  # noqa: E402
    LoraSettings,
    RLVRConfig,
    TrainConfig,  # noqa: E402
)
from rlscale.rlvr.logprobs import completion_logprobs  # noqa: E402
from rlscale.rlvr.loop import train  # noqa: E402
from rlscale.rlvr.lora import LoraError, apply_lora  # noqa: E402
from rlscale.rlvr.model import load_model  # noqa: E402
from rlscale.rlvr.step_loss import StepLoss  # noqa: E402
from rlscale.rlvr.trainer import PolicyTrainer  # noqa: E402


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 90, (5,), generator=g).tolist() for _ in range(4)]
    completions = torch.randint(4, 90, (4, 6), generator=g)
    mask = torch.ones(4, 6)
    return build_policy_batch(prompts, completions, mask, torch.tensor([1.0, -1.0, 0.5, -0.5]),
                              torch.zeros(4, 6), pad_token_id=0, policy_version=0)


def _trainer(model, kl_coef: float = 0.1) -> PolicyTrainer:
    objective = dataclasses.replace(objectives.PRESETS["grpo"], kl_coef=kl_coef)
    return PolicyTrainer(model, None, StepLoss(objective), TrainConfig(lr=1e-2, grad_clip=1.0),
                         temperature=1.0)


def test_reference_by_disabled_adapters_equals_the_base_model(tiny_model_dir):
    base, _ = load_model(tiny_model_dir)
    model, _ = load_model(tiny_model_dir)
    model = apply_lora(model, LoraSettings(r=4))
    trainer = _trainer(model)
    batch = _batch()
    for _ in range(3):  # the adapters move away from zero
        metrics = trainer.step(batch, torch.Generator().manual_seed(0)).metrics
    assert metrics["kl/mean"] > 0  # the KL term saw a reference that differs from the policy
    reference = trainer.reference_logprobs(batch)
    base_logp = _trainer(base).score_logprobs(base, batch)
    assert torch.allclose(reference, base_logp, atol=1e-6)
    adapted = trainer.score_logprobs(model, batch)
    assert (adapted - base_logp).abs().max() > 1e-3  # and the adapters are back on after it


def test_only_the_adapters_train(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    model = apply_lora(model, LoraSettings(r=4, target_modules=["q_proj", "v_proj"]))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    _trainer(model, kl_coef=0.0).step(_batch(), torch.Generator().manual_seed(0))
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name


def test_unknown_target_modules_are_a_one_line_error(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    with pytest.raises(LoraError, match="model.lora") as info:
        apply_lora(model, LoraSettings(target_modules=["no_such_proj"]))
    assert "\n" not in str(info.value)


def test_lora_with_the_vllm_fleet_is_a_config_error(tiny_model_dir, tmp_path):
    """The native fleet takes LoRA (adapters sent, merged on the worker); vLLM's is not built."""
    with pytest.raises(ConfigError, match="model.lora with rollout.engine vllm"):
        load_config(RLVRConfig, None, [f"model.path={tiny_model_dir}", "model.lora.r=4",
                                       "runtime.mode=async", "rollout.engine=vllm"])
    load_config(RLVRConfig, None, [f"model.path={tiny_model_dir}", "model.lora.r=4",
                                   "runtime.mode=async"])


def _config(tiny_model_dir: Path, run_dir: Path, save: str, steps: int) -> RLVRConfig:
    return load_config(RLVRConfig, None, [
        f"model.path={tiny_model_dir}", f"run_dir={run_dir}", "model.lora.r=4",
        f"model.lora.save={save}", "task.name=arithmetic", "loss.kl_coef=0.05",
        "task.reward=verifier_faults:digit_share",  # varies even for a random model
        "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=6",
        f"train.steps={steps}", "train.lr=1e-2", "checkpoint.every=1", "eval.every=0",
        "tensorboard=false", "progress=false"])


@torch.no_grad()
def _logprobs(model) -> torch.Tensor:
    return completion_logprobs(model.eval(), _batch(seed=5))[0]


def test_train_saves_merged_or_adapter_and_resumes(tiny_model_dir, tmp_path):
    merged = train(_config(tiny_model_dir, tmp_path / "merged", "merged", 2))
    assert (merged / "config.json").is_file() and not (merged / "adapter_config.json").exists()
    merged_model, _ = load_model(merged)
    base, _ = load_model(tiny_model_dir)
    assert (_logprobs(merged_model) - _logprobs(base)).abs().max() > 1e-4  # it trained

    adapter = train(_config(tiny_model_dir, tmp_path / "adapter", "adapter", 2))
    assert (adapter / "adapter_config.json").is_file()
    from peft import PeftModel

    reloaded = PeftModel.from_pretrained(load_model(tiny_model_dir)[0], adapter)
    # The same seeds and steps: the adapter folder is the merged model, unmerged.
    assert torch.allclose(_logprobs(reloaded), _logprobs(merged_model), atol=1e-5)

    # A checkpoint holds the adapters and the optimiser: resume to step 3.
    assert (tmp_path / "adapter" / "checkpoints").is_dir()
    train(_config(tiny_model_dir, tmp_path / "adapter", "adapter", 3), resume=True)
    steps = [json.loads(line)["step"] for line in
             (tmp_path / "adapter" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_sft_with_lora_saves_a_merged_model(tiny_model_dir, tmp_path):
    from rlscale.rlvr.config import SFTConfig
    from rlscale.rlvr.distill import sft

    out = sft(load_config(SFTConfig, None, [
        f"model.path={tiny_model_dir}", "model.lora.r=4", f"out={tmp_path / 'model'}",
        f"run_dir={tmp_path / 'run'}", "task.name=arithmetic", "data.examples=64", "steps=3",
        "batch_size=16", "lr=1e-2", "warmup_steps=0", "tensorboard=false", "progress=false"]))
    trained, _ = load_model(out)
    base, _ = load_model(tiny_model_dir)
    assert not (out / "adapter_config.json").exists()
    assert (_logprobs(trained) - _logprobs(base)).abs().max() > 1e-4
