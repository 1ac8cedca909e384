"""The last failure paths of a hostile first use (issue: chaos-proof fleets): each a one-line
error with exit status 2 before anything is lost, or a warning that names what does nothing."""

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from faults_helpers import invoke, one_line_error, rlvr_config, steps_of, zero_config

from rlscale.runtime import checkpoint as ckpt


def test_vllm_engine_without_vllm_is_one_line_before_the_run_dir(tmp_path, tiny_model_dir,
                                                                  monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run)
    one_line_error(invoke("rlvr", "train", cfg, "runtime.mode=async", "rollout.engine=vllm"),
                   "vllm", "rollout.engine=native")
    assert not run.exists()


def test_compile_without_a_cxx_compiler_is_one_line_before_the_run_dir(tmp_path, tiny_model_dir,
                                                                      monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run)
    one_line_error(invoke("rlvr", "train", cfg, "train.compile=true"),
                   "C++ compiler", "train.compile=false")
    assert not run.exists()


def test_fleet_keys_in_the_sync_loop_are_named_in_a_warning(tmp_path, tiny_model_dir):
    cfg = rlvr_config(tmp_path, tiny_model_dir, tmp_path / "run", train={"steps": 1},
                      checkpoint={"every": 0})
    result = invoke("rlvr", "train", cfg, "rollout.engine=vllm", "runtime.inference_workers=4")
    assert result.exit_code == 0, result.output
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "rollout.engine=vllm" in warning[0]
    assert "runtime.inference_workers=4" in warning[0] and "do nothing" in warning[0]


@pytest.mark.parametrize("loop", ["rlvr", "zero"])
def test_an_unreachable_cluster_is_one_line_within_the_timeout(tmp_path, tiny_model_dir, loop):
    if loop == "rlvr":
        cfg = rlvr_config(tmp_path, tiny_model_dir, tmp_path / "run")
        args = ("rlvr", "train", cfg, "runtime.mode=async", "runtime.address=127.0.0.1:1",
                "runtime.connect_timeout_s=1.5")
    else:
        cfg = zero_config(tmp_path, tmp_path / "zrun")
        args = ("zero", "train", cfg, "runtime.actors=1", "runtime.address=127.0.0.1:1",
                "runtime.connect_timeout_s=1.5")
    start = time.monotonic()
    line = one_line_error(invoke(*args), "127.0.0.1:1", "not reachable",
                          "runtime.connect_timeout_s")
    assert 1.4 < time.monotonic() - start < 30, line
    if loop == "rlvr":
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override", ["task.rewards=[{fn: verifier, weight: .nan}]",
                                      "task.rewards=[{fn: verifier, weight: .inf}]",
                                      "train.lr=.nan", "loss.clip_low=-.inf"])
def test_non_finite_config_numbers_are_refused(tmp_path, tiny_model_dir, override):
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run)
    line = one_line_error(invoke("rlvr", "train", cfg, override), "finite")
    assert override.split("=")[0].split(".")[0] in line
    assert not run.exists()


def test_a_rule_broken_by_the_command_line_names_it(tmp_path, tiny_model_dir):
    cfg = rlvr_config(tmp_path, tiny_model_dir, tmp_path / "run",
                      model={"path": str(tiny_model_dir), "lora": {"r": 4}},
                      rollout={"engine": "vllm"})
    line = one_line_error(invoke("rlvr", "train", cfg, "runtime.mode=async"), "lora")
    assert "command line" in line and "runtime.mode=async" in line


def test_a_full_disk_while_checkpointing_is_one_line_and_resume_continues(
        tmp_path, tiny_model_dir, monkeypatch):
    """torch.save on a full disk raises the RuntimeError torch raises there; the second
    checkpoint fails, the first stays intact, and after 'freeing space' --resume goes on."""
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 4},
                      checkpoint={"every": 2, "keep": 3})
    real_save, calls = torch.save, []

    def full_disk(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 2:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter "
                               "failed writing file data/0: file write failed")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    line = one_line_error(invoke("rlvr", "train", cfg), "step_000004", "No space left",
                          "MiB free", "--resume")
    assert "earlier checkpoints are kept" in line
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000002"]
    assert ckpt.checkpoint_problem(run / "checkpoints" / "step_000002") is None
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    monkeypatch.setattr(torch, "save", real_save)
    result = invoke("rlvr", "train", cfg, "--resume")
    assert result.exit_code == 0, result.output
    assert steps_of(run) == [1, 2, 3, 4]


def test_a_full_disk_while_saving_a_lora_checkpoint_is_one_line(tmp_path, tiny_model_dir,
                                                                monkeypatch):
    """safetensors reports a full disk as its own SafetensorError (neither OSError nor
    RuntimeError), from save_pretrained inside the checkpoint's atomic write: still one line,
    and the earlier checkpoint stays intact."""
    import safetensors.torch
    from safetensors import SafetensorError

    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 4},
                      checkpoint={"every": 2, "keep": 3},
                      model={"path": str(tiny_model_dir), "lora": {"r": 4}})
    real = safetensors.torch.serialize_file

    def full_disk(tensors, filename, *args, **kwargs):
        if "step_000004" in str(filename):
            raise SafetensorError("Error while serializing: I/O error: No space left on device "
                                  "(os error 28)")
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "serialize_file", full_disk)
    line = one_line_error(invoke("rlvr", "train", cfg), "step_000004", "No space left",
                          "--resume")
    assert "earlier checkpoints are kept" in line
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000002"]
    assert ckpt.checkpoint_problem(run / "checkpoints" / "step_000002") is None
    assert (run / "checkpoints" / "step_000002" / "adapter_model.safetensors").is_file()


def test_a_metrics_write_error_is_one_line(tmp_path, tiny_model_dir, monkeypatch):
    from rlscale.runtime import metrics

    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 3})
    real_dumps = metrics.json.dumps

    def failing_dumps(row, *args, **kwargs):
        if isinstance(row, dict) and row.get("step") == 2:
            raise OSError(28, "No space left on device")
        return real_dumps(row, *args, **kwargs)

    monkeypatch.setattr(metrics.json, "dumps", failing_dumps)
    one_line_error(invoke("rlvr", "train", cfg), "metrics.jsonl", "No space left")
    assert steps_of(run) == [1]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_says_where_the_run_stopped_and_how_to_resume(
        tmp_path, tiny_model_dir, sig, status):
    """Ctrl-C, and SIGTERM (what schedulers and `timeout` send) the same way: the message,
    the lock removed, exit status 130 / 143."""
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 100000},
                      checkpoint={"every": 1, "keep": 2})
    # A test runner started in the background (`cmd &` without job control) ignores SIGINT,
    # and an ignored signal stays ignored across exec: give the run Ctrl-C's default back.
    proc = subprocess.Popen([sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while not ckpt.list_checkpoints(run) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ckpt.list_checkpoints(run), "no checkpoint within 300 s"
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=180)  # a loaded machine is slow to unwind
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr
    line = next(line for line in stderr.splitlines() if line.startswith("interrupted:"))
    assert "last checkpoint is step" in line and f"rlscale rlvr train {cfg} --resume" in line
    assert not (run / ".lock").exists()


def test_vllm_compiles_only_where_the_run_is_long_enough(tmp_path, tiny_model_dir):
    from rlscale.config import load_config
    from rlscale.rlvr.config import VLLM_COMPILE_PAYS_TOKENS, RLVRConfig

    def cfg(*overrides):
        return load_config(RLVRConfig, None, [f"model.path={tiny_model_dir}",
                                              "runtime.mode=async", "rollout.engine=vllm",
                                              "runtime.inference_workers=2", *overrides])

    short = cfg("train.steps=4", "rollout.prompts_per_step=32", "rollout.group_size=8",
                "rollout.max_new_tokens=8")
    assert short.vllm_eager()  # 4 x 32 x 8 x 8 / 2 = 4 k tokens per worker: eager
    steps = 2 * VLLM_COMPILE_PAYS_TOKENS // (32 * 8 * 256) + 1
    long = cfg(f"train.steps={steps}", "rollout.prompts_per_step=32", "rollout.group_size=8",
               "rollout.max_new_tokens=256")
    assert not long.vllm_eager()
    assert cfg("train.steps=4", "rollout.vllm_enforce_eager=false").vllm_eager() is False
    assert long.model_copy(update={"rollout": long.rollout.model_copy(
        update={"vllm_enforce_eager": True})}).vllm_eager() is True
