"""Kill a training run with SIGKILL mid-step, resume it, and compare with an unbroken run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

STEPS = 8


def write_config(path: Path, model_dir: Path, run_dir: Path) -> Path:
    cfg = {
        "run_dir": str(run_dir),
        "model": {"path": str(model_dir)},
        "task": {"name": "arithmetic", "options": {"add_digits": 2}},
        "objective": "grpo",
        "loss": {"kl_coef": 0.01},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "train": {"steps": STEPS, "lr": 1e-3, "minibatches": 2, "seed": 3, "threads": 1},
        "checkpoint": {"every": 2, "keep": 2},
        "tensorboard": False,
        "progress": False,
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def train_cmd(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(config), *extra]


def read_steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sigkill_mid_run_then_resume_matches_unbroken_run(tmp_path, tiny_model_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    reference_dir = tmp_path / "reference"
    ref_cfg = write_config(tmp_path / "ref.yaml", tiny_model_dir, reference_dir)
    subprocess.run(train_cmd(ref_cfg), check=True, env=env, capture_output=True)

    run_dir = tmp_path / "killed"
    cfg = write_config(tmp_path / "run.yaml", tiny_model_dir, run_dir)
    proc = subprocess.Popen(train_cmd(cfg), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    # Kill once step 5 has been logged: a checkpoint exists at step 4, step 6 is in flight.
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(read_steps(run_dir))
    assert killed_at < STEPS, "the run finished before it could be killed"
    assert not (run_dir / "final").exists()

    result = subprocess.run(train_cmd(cfg, "--resume"), env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

    resumed, reference = read_steps(run_dir), read_steps(reference_dir)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))  # none lost, none doubled
    assert (run_dir / "final" / "config.json").exists()
    # Same data order and RNG state: every step saw the same prompts, samples and rewards.
    for a, b in zip(resumed, reference, strict=True):
        assert a["reward/mean"] == b["reward/mean"], a["step"]
        assert abs(a["loss/loss"] - b["loss/loss"]) < 1e-5, a["step"]


def test_resume_refuses_to_overwrite_and_continues_a_finished_run(tmp_path, tiny_model_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "run.yaml", tiny_model_dir, run_dir)
    subprocess.run(train_cmd(cfg, "train.steps=4"), check=True, env=env, capture_output=True)
    again = subprocess.run(train_cmd(cfg, "train.steps=4"), env=env, capture_output=True, text=True)
    assert again.returncode == 2
    assert "--resume" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    more = subprocess.run(train_cmd(cfg, "train.steps=6", "--resume"), env=env,
                          capture_output=True, text=True)
    assert more.returncode == 0, more.stderr
    assert [r["step"] for r in read_steps(run_dir)] == list(range(1, 7))
