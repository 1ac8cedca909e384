"""The training reward as weighted terms: the task's verifier, the built-in format reward and
user functions by dotted path, each logged as reward/<name>, each run in the verifier pool
(so a user function that hangs, crashes or raises scores 0, counted by cause)."""

from pathlib import Path

import pytest
import torch

from rlscale.config import ConfigError, load_config
from rlscale.rlvr.config import RLVRConfig, TaskConfig
from rlscale.rlvr.rewards import VERIFIER, VerifierPool, format_reward, reward_terms
from rlscale.rlvr.tasks import Example, make_task
from rlscale.runtime.dotted import DottedPathError
from verifier_faults import ScriptedTask

REPO = Path(__file__).resolve().parents[1]


EX = Example("Calculate 1 + 1.", "2")


def test_format_reward():
    assert format_reward("<answer>2</answer>", EX) == 1.0
    assert format_reward("  <answer> any text </answer>\n", EX) == 1.0
    assert format_reward("2", EX) == 0.0
    assert format_reward("so <answer>2</answer>", EX) == 0.0
    assert format_reward("<answer>1</answer><answer>2</answer>", EX) == 0.0
    assert format_reward("<sum>2</sum>", EX, tag="sum") == 1.0


def test_terms_from_config():
    task = make_task("arithmetic")
    assert reward_terms(task, TaskConfig()) == VERIFIER
    (term,) = reward_terms(task, TaskConfig(reward="verifier_faults:length_reward"))
    assert (term.name, term.weight) == ("length_reward", 1.0)
    terms = reward_terms(task, TaskConfig(rewards=[
        {"fn": "verifier", "weight": 1.0}, {"fn": "format", "weight": 0.2},
        {"fn": "verifier_faults:length_reward", "weight": -0.01, "name": "len"}]))
    assert [(t.name, t.weight) for t in terms] == [("verifier", 1.0), ("format", 0.2), ("len", -0.01)]
    with pytest.raises(ValueError, match="reward names must differ"):
        reward_terms(task, TaskConfig(rewards=[{"fn": "verifier"}, {"fn": "verifier"}]))
    with pytest.raises(ValueError, match="reserved"):
        reward_terms(task, TaskConfig(rewards=[{"fn": "format", "name": "mean"}]))
    with pytest.raises(DottedPathError, match="cannot import module 'nowhere'") as exc:
        reward_terms(task, TaskConfig(reward="nowhere:fn"))
    assert "\n" not in str(exc.value)
    with pytest.raises(DottedPathError, match="not callable"):
        reward_terms(task, TaskConfig(reward="math:pi"))


def test_reward_and_rewards_together_is_a_config_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: m}\ntask: {reward: 'a:b', rewards: [{fn: verifier}]}\n")
    with pytest.raises(ConfigError, match="task.reward or task.rewards"):
        load_config(RLVRConfig, path)


def test_the_format_term_uses_the_tasks_tag():
    task = make_task("reasoning_gym:chain_sum", answer_tag="sum", size=10)
    (term,) = reward_terms(task, TaskConfig(reward="format"))
    assert term.fn("<sum>3</sum>", EX) == 1.0 and term.fn("<answer>3</answer>", EX) == 0.0


def test_weighted_sum_and_each_term_in_the_pool():
    task = make_task("arithmetic")
    terms = reward_terms(task, TaskConfig(rewards=[
        {"fn": "verifier", "weight": 1.0},
        {"fn": "verifier_faults:length_reward", "weight": 0.5, "name": "len"}]))
    ex = Example("2+2=", 4)
    with VerifierPool(task, terms=terms, timeout_s=5) as pool:
        scored = pool.score(["4", "44", "5"], [ex] * 3)
    assert scored.terms == {"verifier": [1.0, 0.0, 0.0], "len": [1.0, 2.0, 1.0]}
    assert scored.rewards == pytest.approx([1.5, 1.0, 0.5])


@pytest.mark.parametrize("command, counted", [
    ("sleep", "timeouts"), ("segfault", "crashes"), ("alloc", "errors"), ("raise", "errors")])
def test_user_reward_faults_score_zero_counted_by_cause(command, counted):
    terms = reward_terms(ScriptedTask(), TaskConfig(rewards=[
        {"fn": "verifier_faults:scripted_reward", "weight": 2.0, "name": "user"}]))
    with VerifierPool(ScriptedTask(), terms=terms, timeout_s=1.0) as pool:
        scored = pool.score(["1", command, "0.5"], [EX] * 3)
        pids = pool.pids
    assert scored.rewards == [2.0, 0.0, 1.0]
    assert scored.terms["user"] == [1.0, 0.0, 0.5]
    assert getattr(scored, counted) == 1
    assert sum((scored.errors, scored.timeouts, scored.crashes)) == 1
    for pid in pids:  # closed: no worker left behind
        with pytest.raises(ProcessLookupError):
            import os

            os.kill(pid, 0)


def test_training_logs_each_term(tmp_path, tiny_model_dir, monkeypatch):
    """Two GRPO steps on the shipped JSONL example with a weighted user reward."""
    from rlscale.rlvr.loop import train
    from rlscale.runtime.metrics import read_metrics

    monkeypatch.chdir(REPO)  # examples.reward_fns imports from the repository root
    cfg = load_config(RLVRConfig, REPO / "configs/rlvr/math_jsonl.yaml", [
        f"model.path={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", "train.steps=2",
        "rollout.prompts_per_step=4", "rollout.group_size=2", "eval.every=0",
        "checkpoint.every=0", "progress=false", "tensorboard=false"])
    train(cfg)
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2
    for row in rows:
        assert 0.0 <= row["reward/verifier"] <= 1.0 and 0.0 <= row["reward/format"] <= 1.0
        assert row["reward/mean"] == pytest.approx(row["reward/verifier"] + 0.1 * row["reward/format"],
                                                   abs=1e-6)
    assert torch.isfinite(torch.tensor(rows[-1]["loss/loss"]))
