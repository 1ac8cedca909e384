"""GRPO learns: a short run with a fixed seed raises the measured reward by a clear margin."""

from rlscale.config import build_config, load_config
from rlscale.rlvr.config import RLVRConfig, SFTConfig
from rlscale.rlvr.distill import sft
from rlscale.rlvr.evaluate import evaluate
from rlscale.rlvr.loop import train
from rlscale.rlvr.model import load_model
from rlscale.rlvr.tasks import make_task

# One-digit sums: a base model learns them in seconds, and half its demonstrations are wrong
# or sloppy, so it starts well below what its own knowledge allows.
TASK = {"name": "arithmetic", "options": {"add_digits": 1, "mul_share": 0.0}}


def measure(model_dir, task):
    model, tokenizer = load_model(model_dir)
    # Sums of one-digit numbers have ~10 held-out prompts; measure on 64 train prompts x 8.
    return evaluate(model, tokenizer, task, split="train", seed=123, prompts=64, samples=8,
                    ks=(1,), max_new_tokens=6).pass_at[1]


def test_grpo_raises_reward_with_margin(tmp_path):
    base = sft(build_config(SFTConfig, {
        "init_preset": "tiny", "out": str(tmp_path / "base"), "run_dir": str(tmp_path / "sft"),
        "task": TASK, "data": {"examples": 4000, "wrong_share": 0.5}, "steps": 250,
        "batch_size": 64, "lr": 3e-3, "warmup_steps": 20, "tensorboard": False,
        "progress": False}))
    task = make_task(TASK["name"], **TASK["options"])
    before = measure(base, task)

    cfg = load_config(RLVRConfig, None, [
        f"model.path={base}", f"run_dir={tmp_path / 'grpo'}", "task.name=arithmetic",
        "task.options={add_digits: 1, mul_share: 0.0}", "rollout.prompts_per_step=16",
        "rollout.group_size=8", "rollout.max_new_tokens=6", "train.steps=40", "train.lr=2e-4",
        "train.warmup_steps=5", "loss.kl_coef=0", "checkpoint.every=0", "tensorboard=false",
        "progress=false"])
    after = measure(train(cfg), task)
    print(f"learning test: pass@1 {before:.3f} -> {after:.3f}")
    assert 0.2 < before < 0.8, f"base model out of the useful range: {before:.3f}"
    assert after >= before + 0.15, f"pass@1 {before:.3f} -> {after:.3f}"
