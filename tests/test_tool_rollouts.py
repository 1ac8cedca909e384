"""Tool calls in a training run, end to end: a tiny model taught (SFT) to hand steps to the
calculator calls it during GRPO's rollouts; the calls run in worker processes, their results
come back into the completions and out of the loss, and the run logs where the calls went."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlscale.config import build_config
from rlscale.rlvr.config import RLVRConfig, SFTConfig
from rlscale.rlvr.distill import sft
from rlscale.rlvr.loop import RLVRRun

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "rlvr"
OPTIONS = {"min_terms": 2, "max_terms": 3, "max_digits": 2, "tool_share": 0.6,
           "strategies": {"plain": 1.0}}


@pytest.fixture(scope="module")
def tool_base(tmp_path_factory):
    """A base that writes calculator calls in the task's markup (100 SFT steps)."""
    root = tmp_path_factory.mktemp("tools")
    return sft(build_config(SFTConfig, {
        "init_preset": "tiny", "out": str(root / "base"), "run_dir": str(root / "sft"),
        "task": {"name": "long_arithmetic", "options": OPTIONS}, "data": {"examples": 2000},
        "steps": 100, "batch_size": 32, "lr": 3e-3, "warmup_steps": 10, "pack": True,
        "tensorboard": False, "progress": False}))


def test_a_grpo_run_calls_the_calculator_and_logs_where_the_calls_went(tool_base, tmp_path):
    cfg = build_config(RLVRConfig, {
        "model": {"path": str(tool_base)}, "run_dir": str(tmp_path / "grpo"),
        "task": {"name": "long_arithmetic", "options": OPTIONS},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 64,
                    "tools": {"tools": ["calculator"], "max_tool_calls": 4}},
        "train": {"steps": 2, "lr": 1e-4}, "loss": {"kl_coef": 0},
        "checkpoint": {"every": 0}, "tensorboard": False, "progress": False})
    run = RLVRRun(cfg)
    record = run.train_step()  # one step by hand: the batch is there to look at
    run.tools.close()
    run.pool.close()
    run.lock.release()
    m = record.metrics
    assert m["tools/calls"] > 0 and m["tools/calls_per_rollout"] > 0
    # A young model writes some malformed calls ("<c>12+</c>"): failed, counted by cause,
    # and most calls are well-formed.
    assert m["tools/failed"] <= m["tools/calls"] / 2
    assert m["tools/failed"] == sum(v for k, v in m.items() if k in (
        "tools/error", "tools/exit", "tools/timeout", "tools/memory", "tools/output_limit",
        "tools/crashed",
        "tools/unknown_tool"))
    assert 0 <= m["tools/wait_share"] < 1
    assert any(k.startswith("difficulty/") and k.endswith("/tool_calls") for k in m)
    assert m["behaviour/tool_steps"] > 0  # the traces carry "<c>..</c><r>..</r>" lines


def test_the_cli_trains_with_tools_from_a_config(tool_base, tmp_path):
    from typer.testing import CliRunner

    from rlscale.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "rlvr", "train", str(CONFIGS / "reasoning_tools.yaml"), f"model.path={tool_base}",
        f"run_dir={out}", "train.steps=2", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "rollout.max_new_tokens=48", "eval.every=0",
        "checkpoint.every=0", "tensorboard=false", "progress=false"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("tools/calls_per_rollout" in r for r in rows)
    # Evaluation with the config's tools: the model calls the calculator there too.
    result = CliRunner().invoke(app, [
        "rlvr", "eval", "--model", str(tool_base), "--config",
        str(CONFIGS / "reasoning_tools.yaml"), "--prompts", "8", "--max-new-tokens", "48",
        "--json"])
    assert result.exit_code == 0, result.output
    details = json.loads(result.output.strip().splitlines()[-1])
    assert details["tools/calls_per_rollout"] > 0 and details["behaviour/tool_steps"] > 0


def test_a_reproducible_tool_run_resumed_from_its_checkpoint_reaches_the_unbroken_run(
        tool_base, tmp_path):
    """rollout.tools.reproducible: the calculator's calls take a random 0-40 ms each, and a
    run stopped after step 2 and resumed still lands on the weights of the run that never
    stopped, bit for bit (without it, the runs part)."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from rlscale.cli import app

    def train(name: str, steps: int, *extra: str) -> Path:
        result = CliRunner().invoke(app, [
            "rlvr", "train", str(CONFIGS / "reasoning_tools.yaml"), f"model.path={tool_base}",
            f"run_dir={tmp_path / name}", f"train.steps={steps}", "rollout.prompts_per_step=2",
            "rollout.group_size=4", "rollout.max_new_tokens=48", "eval.every=0",
            "rollout.tools.tools=[user_tools:jittery_calculator]",
            "rollout.tools.reproducible=true", "checkpoint.every=2", "train.threads=1",
            "train.compute_dtype=float32", "tensorboard=false", "progress=false", *extra])
        assert result.exit_code == 0, result.output
        return tmp_path / name / "final" / "model.safetensors"

    unbroken = load_file(train("unbroken", 3))
    train("broken", 2)
    resumed = load_file(train("broken", 3, "--resume"))
    assert unbroken.keys() == resumed.keys()
    assert all(torch.equal(unbroken[k], resumed[k]) for k in unbroken)
    calls = [json.loads(line)["tools/calls_per_rollout"]
             for line in (tmp_path / "broken" / "metrics.jsonl").read_text().splitlines()]
    assert len(calls) == 3 and sum(calls) > 0


@pytest.mark.slow
def test_a_fleet_run_calls_tools_on_its_inference_workers(tool_base, tmp_path):
    pytest.importorskip("ray")
    from rlscale.rlvr.loop import train

    out = tmp_path / "fleet"
    cfg = build_config(RLVRConfig, {
        "model": {"path": str(tool_base)}, "run_dir": str(out),
        "task": {"name": "long_arithmetic", "options": OPTIONS},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 48, "slots": 8,
                    "tools": {"tools": ["calculator"]}},
        "runtime": {"mode": "async", "inference_workers": 1, "max_staleness": 1},
        "train": {"steps": 3, "lr": 1e-4}, "loss": {"kl_coef": 0},
        "checkpoint": {"every": 0}, "tensorboard": False, "progress": False})
    train(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    assert sum(r["tools/calls_per_rollout"] for r in rows) > 0
    assert sum(r["behaviour/tool_steps"] for r in rows) > 0
