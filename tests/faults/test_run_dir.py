"""Part 1: a run directory belongs to one run; nothing rlscale did not write is ever deleted."""

import os
import subprocess
import sys
import time

import pytest
import yaml
from faults_helpers import cli, invoke, one_line_error, rlvr_config, steps_of

from rlscale.runtime import rundir


def test_sft_refuses_a_folder_with_user_files_and_never_deletes_them(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(yaml.safe_dump({"init_preset": "tiny", "steps": 1, "batch_size": 2,
                                   "data": {"examples": 4}, "run_dir": str(tmp_path / "run"),
                                   "out": str(out), "tensorboard": False, "progress": False}))
    one_line_error(invoke("sft", cfg), "not empty")
    assert (out / "notes.txt").read_text() == "precious"
    # out = run_dir would replace the run's own metrics and config: refused too
    one_line_error(invoke("sft", cfg, f"out={tmp_path / 'run'}"), "run directory")
    result = invoke("sft", cfg, f"out={tmp_path / 'run' / 'model'}")
    assert result.exit_code == 0, result.output
    assert steps_of(tmp_path / "run") == [1]
    # a second sft into the same run refuses; --overwrite replaces only rlscale's files
    one_line_error(invoke("sft", cfg, f"out={tmp_path / 'run' / 'model'}"), "--overwrite")
    (tmp_path / "run" / "mine.txt").write_text("keep")
    one_line_error(invoke("sft", cfg, f"out={tmp_path / 'run' / 'model'}", "--overwrite"),
                   "did not write")
    assert (tmp_path / "run" / "mine.txt").read_text() == "keep"
    (tmp_path / "run" / "mine.txt").unlink()
    result = invoke("sft", cfg, f"out={tmp_path / 'run' / 'model'}", "--overwrite")
    assert result.exit_code == 0, result.output


def test_init_model_refuses_to_replace_a_model_without_overwrite(tmp_path):
    out = tmp_path / "m"
    assert invoke("rlvr", "init-model", "--out", out).exit_code == 0
    before = (out / "model.safetensors").read_bytes()
    one_line_error(invoke("rlvr", "init-model", "--out", out, "--seed", "1"), "--overwrite")
    assert (out / "model.safetensors").read_bytes() == before
    assert invoke("rlvr", "init-model", "--out", out, "--seed", "1", "--overwrite").exit_code == 0
    assert (out / "model.safetensors").read_bytes() != before
    user = tmp_path / "user"
    user.mkdir()
    (user / "weights.bin").write_text("x")
    one_line_error(invoke("rlvr", "init-model", "--out", user, "--overwrite"), "not empty")
    assert (user / "weights.bin").exists()


def test_fresh_train_into_a_finished_run_without_checkpoints_is_refused(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 2},
                      checkpoint={"every": 0})
    assert invoke("rlvr", "train", cfg).exit_code == 0
    metrics = (run / "metrics.jsonl").read_text()
    final = (run / "final" / "model.safetensors").read_bytes()
    one_line_error(invoke("rlvr", "train", cfg, "train.seed=5"), "--resume", "--overwrite")
    assert (run / "metrics.jsonl").read_text() == metrics
    assert (run / "final" / "model.safetensors").read_bytes() == final
    result = invoke("rlvr", "train", cfg, "--overwrite")
    assert result.exit_code == 0, result.output
    assert steps_of(run) == [1, 2]


def test_a_failed_first_start_is_taken_over_by_the_same_command(tmp_path, tiny_model_dir):
    """A start that failed before its first step left config.yaml (and empty logs): the same
    command starts over with a notice. A run that completed a step stays protected."""
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 1},
                      checkpoint={"every": 0})
    run.mkdir()
    (run / "config.yaml").write_text("what a failed start wrote\n")
    (run / "tb").mkdir()
    result = invoke("rlvr", "train", cfg)
    assert result.exit_code == 0, result.output
    assert "never completed a step" in result.stderr and "error" not in result.stderr
    assert steps_of(run) == [1] and (run / "final").is_dir()
    # the completed run is protected again
    one_line_error(invoke("rlvr", "train", cfg), "--resume", "--overwrite")
    # progress is any of: a metrics line, a checkpoint, a model
    for made in ("metrics.jsonl", "checkpoints/step_000001", "final"):
        probe = tmp_path / f"probe_{made.replace('/', '_')}"
        (probe / "tb").mkdir(parents=True)
        (probe / "config.yaml").write_text("x\n")
        target = probe / made
        if made.endswith(".jsonl"):
            target.write_text('{"step": 1}\n')
        else:
            target.mkdir(parents=True)
        with pytest.raises(rundir.RunDirError, match="already holds a run"):
            rundir.prepare_run_dir(probe)
        assert target.exists()
    # leftovers of a killed atomic write are not progress
    empty = tmp_path / "empty_start"
    (empty / "checkpoints" / ".tmp-step_000001").mkdir(parents=True)
    (empty / "config.yaml").write_text("x\n")
    rundir.prepare_run_dir(empty).release()
    assert not (empty / "config.yaml").exists()


def test_run_dir_with_foreign_files_and_unwritable_run_dir(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / "thesis.tex").write_text("x")
    cfg = rlvr_config(tmp_path, tiny_model_dir, run)
    one_line_error(invoke("rlvr", "train", cfg), "did not write", "thesis.tex")
    one_line_error(invoke("rlvr", "train", cfg, "--overwrite"), "did not write")
    assert (run / "thesis.tex").exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    one_line_error(invoke("rlvr", "train", cfg, f"run_dir={blocker}/sub"), "cannot write")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        one_line_error(invoke("rlvr", "train", cfg, f"run_dir={locked}/run"), "cannot write")


def test_lock_refuses_a_live_owner_and_takes_over_a_dead_one(tmp_path):
    run = tmp_path / "run"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run.mkdir()
        (run / ".lock").write_text(f"{__import__('socket').gethostname()} {sleeper.pid}\n")
        with pytest.raises(rundir.RunDirError, match=f"pid {sleeper.pid}"):
            rundir.prepare_run_dir(run, resume=True)
    finally:
        sleeper.kill()
        sleeper.wait()
    lock = rundir.prepare_run_dir(run, resume=True)  # dead owner: taken over with a warning
    assert (run / ".lock").read_text().split()[1] == str(os.getpid())
    lock.release()
    assert not (run / ".lock").exists()


def test_two_concurrent_runs_in_one_run_dir(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 400},
                      checkpoint={"every": 0})
    first = subprocess.Popen([sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(cfg)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (run / "metrics.jsonl").exists():
            time.sleep(0.1)
        second = cli("rlvr", "train", cfg, "--resume")
        one_line_error(second, "in use", str(first.pid))
    finally:
        first.kill()
        first.wait()
    steps = steps_of(run)
    assert steps == list(range(1, len(steps) + 1))  # one writer: no interleaved steps
