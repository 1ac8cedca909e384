"""A new user's first hour (issue 56): a damaged model is one line, and nothing surprises in
silence -- a YAML key given twice, `--resume` with nothing to resume, SIGTERM, a run that
scores 0 on every sample."""

import os
import shutil
from pathlib import Path

from faults_helpers import invoke, one_line_error, rlvr_config, zero_config
from safetensors.torch import load_file, save_file

from rlscale.config import read_yaml


def _damaged_copies(tmp_path, model_dir):
    """(folder, words its error must name) for a truncated file, a torn header, NaN weights."""
    def copy(name):
        return shutil.copytree(model_dir, tmp_path / name)

    truncated = copy("truncated")
    weights = truncated / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    torn = copy("torn")
    data = bytearray((torn / "model.safetensors").read_bytes())
    data[8:20] = b"not a header"
    (torn / "model.safetensors").write_bytes(bytes(data))
    nan = copy("nan")
    tensors = load_file(nan / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(tensors, nan / "model.safetensors", metadata={"format": "pt"})
    return [(truncated, ["model.safetensors", "truncated"]),
            (torn, ["model.safetensors", "unreadable header"]),
            (nan, ["NaN/inf", "model.layers.0.mlp.up_proj.weight"])]


def test_a_damaged_or_non_finite_model_is_one_line_in_train_and_eval(tmp_path, tiny_model_dir):
    for folder, words in _damaged_copies(tmp_path, tiny_model_dir):
        one_line_error(invoke("rlvr", "eval", "--model", folder, "--task", "arithmetic",
                              "--prompts", "1"), str(folder), *words)
        cfg = rlvr_config(tmp_path, folder, tmp_path / f"run-{folder.name}")
        one_line_error(invoke("rlvr", "train", cfg), str(folder), *words)
    # Zero's loader too: a NaN network would search and play without a word
    shipped = Path(__file__).resolve().parents[2] / "src/rlscale/zero/models/connect4"
    nan = shutil.copytree(shipped, tmp_path / "zero-nan")
    tensors = load_file(nan / "model.safetensors")
    name = next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[name].view(-1)[0] = float("inf")
    save_file(tensors, nan / "model.safetensors")
    one_line_error(invoke("zero", "move", "--game", "connect4", "--moves", "4",
                          "--simulations", "2", "--model", nan), str(nan), "NaN/inf", name)


def test_a_yaml_key_given_twice_is_refused_with_its_lines(tmp_path, tiny_model_dir):
    cfg = rlvr_config(tmp_path, tiny_model_dir, tmp_path / "run")
    text = cfg.read_text()
    twice = tmp_path / "twice.yaml"
    twice.write_text(text + "train:\n  lr: 1.0\n")  # a second section silently replaced the first
    first = 1 + text.splitlines().index("train:")
    one_line_error(invoke("rlvr", "train", twice), str(twice), "'train'", "twice",
                   f"lines {first} and {len(text.splitlines()) + 1}")
    inner = tmp_path / "inner.yaml"
    inner.write_text(text.replace("  lr: 0.001\n", "  lr: 0.001\n  lr: 1.0\n"))
    one_line_error(invoke("rlvr", "train", inner), "'lr'", "twice")
    # a merge key is no duplicate: `<<: *base` then an explicit key overrides it by design
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &base {lr: 0.1, steps: 2}\ntrain:\n  <<: *base\n  lr: 0.2\n")
    assert read_yaml(merged)["train"] == {"lr": 0.2, "steps": 2}


def test_resume_with_nothing_to_resume_is_one_line(tmp_path, tiny_model_dir):
    missing = tmp_path / "missing"
    cfg = rlvr_config(tmp_path, tiny_model_dir, missing)
    one_line_error(invoke("rlvr", "train", cfg, "--resume"), "nothing to resume", str(missing),
                   "does not exist", "drop --resume")
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(invoke("rlvr", "train", cfg, f"run_dir={empty}", "--resume"),
                   "nothing to resume", "empty", "drop --resume")
    assert not list(empty.iterdir())  # its lock is gone again
    zero_out = tmp_path / "zero"
    zcfg = zero_config(tmp_path, zero_out)
    one_line_error(invoke("zero", "train", zcfg, "--resume", "--no-progress"),
                   "nothing to resume", str(zero_out), "drop --resume")
    assert not zero_out.exists()


def test_a_run_scoring_zero_on_every_sample_warns_once_and_says_so_at_the_end(
        tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 4},
                      checkpoint={"every": 0},
                      task={"reward": "verifier_faults:always_fails"},
                      health={"zero_reward_steps": 2})
    result = invoke("rlvr", "train", cfg)
    assert result.exit_code == 0, (result.output, result.stderr)
    warnings = [line for line in result.stderr.splitlines()
                if line.startswith("warning:") and "reward was 0 for every sample" in line]
    assert len(warnings) == 2, result.stderr  # once when it happens, once in the summary
    assert warnings[0].startswith("warning: step 2:") and "steps (1-2)" in warnings[0]
    assert warnings[1].startswith("warning: run summary:") and "steps 1-4" in warnings[1]
