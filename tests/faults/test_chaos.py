"""Part 7: the chaos kill test. SIGKILL a run mid-checkpoint-write (a fault point), then at a
random moment, resume each time; metrics and final weights must equal an unbroken run's."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults_helpers import invoke, rlvr_config, zero_config
from safetensors.torch import load_file


def _popen(args: list, fault: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RLSCALE_FAULT", None)
    if fault:
        env["RLSCALE_FAULT"] = fault
    return subprocess.Popen([sys.executable, "-m", "rlscale.cli", *map(str, args)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _kill_after(proc: subprocess.Popen, run: Path, lines: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        path = run / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= lines:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _chaos(args: list, run: Path, total: int, seed: int) -> None:
    # 1. killed by the fault point inside the second checkpoint write (files written, not renamed)
    proc = _popen(args, fault="checkpoint-write@2")
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read()
    assert list((run / "checkpoints").glob(".tmp-*")), "the kill left no torn checkpoint"
    # 2. resumed, then killed at a random step
    proc = _popen([*args, "--resume"])
    _kill_after(proc, run, random.Random(seed).randrange(2, total))
    # 3. resumed to the end (taking over the dead run's lock)
    proc = _popen([*args, "--resume"])
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    assert not list(run.glob("**/.tmp-*")) and not (run / ".lock").exists()


def test_rlvr_chaos_kills_match_an_unbroken_run(tmp_path, tiny_model_dir):
    steps = 6
    reference = tmp_path / "reference"
    ref_cfg = rlvr_config(tmp_path, tiny_model_dir, reference, train={"steps": steps},
                          checkpoint={"every": 1, "keep": 2})
    assert invoke("rlvr", "train", ref_cfg).exit_code == 0
    run = tmp_path / "chaos"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": steps},
                      checkpoint={"every": 1, "keep": 2})
    _chaos(["rlvr", "train", cfg], run, steps, seed=0)
    got, want = _rows(run), _rows(reference)
    assert [r["step"] for r in got] == list(range(1, steps + 1))
    for a, b in zip(got, want, strict=True):
        assert a["reward/mean"] == b["reward/mean"], a["step"]
        assert abs(a["loss/loss"] - b["loss/loss"]) < 1e-5, a["step"]
    mine, theirs = (load_file(d / "final" / "model.safetensors") for d in (run, reference))
    assert all((mine[k] - theirs[k]).abs().max() < 1e-5 for k in theirs)


def test_zero_chaos_kills_match_an_unbroken_run(tmp_path):
    iterations = 5
    reference = tmp_path / "reference"
    assert invoke("zero", "train", zero_config(tmp_path, reference, train={
        "iterations": iterations}), "--no-progress").exit_code == 0
    run = tmp_path / "chaos"
    cfg = zero_config(tmp_path, run, train={"iterations": iterations})
    _chaos(["zero", "train", cfg, "--no-progress"], run, iterations, seed=1)
    got, want = _rows(run), _rows(reference)
    assert [r["step"] for r in got] == list(range(1, iterations + 1))
    for a, b in zip(got, want, strict=True):
        for key in ("credit/value_loss", "bias_variance/policy_loss", "moving/game_length",
                    "counters/samples"):
            assert a.get(key) == b.get(key), (a["step"], key)


def _chaos_module():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"
    spec = importlib.util.spec_from_file_location("chaos_soak", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos_soak"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_rlvr_fleet_soak_survives_worker_and_trainer_kills(tmp_path, tiny_model_dir):
    """benchmarks/chaos.py's soak, short: an in-flight fleet run whose inference workers and
    trainer are SIGKILLed at random; every step once, the ledger balanced at every step, the
    staleness bound held, no process left."""
    chaos = _chaos_module()
    run = tmp_path / "soak"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 300},
                      rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 3,
                               "slots": 8},
                      runtime={"mode": "inflight", "inference_workers": 2, "max_staleness": 1},
                      checkpoint={"every": 5, "keep": 2})
    soak = chaos.Soak("rlvr", ["rlvr", "train", str(cfg)], run, "ray::InferenceWorker", [],
                      "pass@1", per_step=2, max_staleness=1)
    # Kills ~10 s apart: a restarted worker (a new process that loads the model) must live
    # to answer a call, or its deaths in a row are a crash loop that ends the run by design.
    result = chaos.run_soak(soak, worker_every=10, trainer_every=30, seed=0,
                            log=tmp_path / "soak.log", timeout_s=1800)
    assert result.worker_kills >= 2 and result.trainer_kills >= 1, result
    rows = chaos.read_rows(run)
    assert chaos.ledger_problems(soak, rows) == []
    assert len(rows) == 300 and rows[-1]["fleet/ledger_discarded_on_resume"] > 0
    assert result.processes_seen > 3 and result.processes_left == [], result


@pytest.mark.slow
def test_zero_fleet_soak_survives_actor_and_learner_kills(tmp_path):
    chaos = _chaos_module()
    run = tmp_path / "soak"
    cfg = zero_config(tmp_path, run, train={"iterations": 150, "threads": 1},
                      runtime={"actors": 2}, checkpoint={"every": 2, "keep": 2})
    soak = chaos.Soak("zero", ["zero", "train", str(cfg), "--no-progress"], run,
                      "ray::SelfPlayWorker", [], "agreement", per_step=4)
    result = chaos.run_soak(soak, worker_every=6, trainer_every=30, seed=1,
                            log=tmp_path / "soak.log", timeout_s=1800)
    assert result.worker_kills >= 2 and result.trainer_kills >= 1, result
    rows = chaos.read_rows(run)
    assert chaos.ledger_problems(soak, rows) == []
    assert len(rows) == 150
    assert result.processes_seen > 3 and result.processes_left == [], result
