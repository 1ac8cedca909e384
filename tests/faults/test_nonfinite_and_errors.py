"""Parts 4-6: the non-finite guard, one-line errors everywhere, progress readable in logs."""

import io
import json

import pytest
import yaml
from faults_helpers import invoke, one_line_error, rlvr_config, steps_of, zero_config

from rlscale.config import ConfigError, load_config
from rlscale.rlvr.config import RLVRConfig
from rlscale.rlvr.tasks import make_task
from rlscale.runtime.metrics import StepProgress


def test_rlvr_diverging_update_is_skipped_counted_and_stops_resumably(tmp_path, tiny_model_dir,
                                                                      monkeypatch):
    """An optimiser step that leaves non-finite weights (a diverging update: config numbers
    themselves cannot be nan or inf) is undone, counted, and stops the run resumably."""
    import torch

    real_step = torch.optim.AdamW.step

    def diverging(self, *args, **kwargs):
        real_step(self, *args, **kwargs)
        with torch.no_grad():
            next(p for g in self.param_groups for p in g["params"]).fill_(float("nan"))

    monkeypatch.setattr(torch.optim.AdamW, "step", diverging)
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 6},
                      health={"max_nonfinite_steps": 2})
    result = invoke("rlvr", "train", cfg)
    line = one_line_error(result, "non-finite", "resume", status=1)
    assert "step_000002" in line
    assert result.stderr.count("warning: step 1: non-finite") == 1
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["health/skipped_steps"] for r in rows] == [1, 2]
    # the checkpoint holds the last good (initial) weights; the run resumes once updates are sane
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    result = invoke("rlvr", "train", cfg, "--resume")
    assert result.exit_code == 0, result.output
    assert steps_of(run) == [1, 2, 3, 4, 5, 6]


def test_zero_diverging_update_stops_with_one_line(tmp_path, monkeypatch):
    """A learner whose updates turn non-finite after a good start (config numbers cannot:
    nan, inf and learning rates above 10 are refused) stops with one line, its last good
    checkpoint kept."""
    import torch

    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def diverging(self, *args, **kwargs):
        real_step(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] > 2:  # the first iteration's updates are sane
            with torch.no_grad():
                next(p for g in self.param_groups for p in g["params"]).fill_(float("nan"))

    monkeypatch.setattr(torch.optim.AdamW, "step", diverging)
    out = tmp_path / "zero"
    cfg = zero_config(tmp_path, out, train={"iterations": 5, "optimizer": "adamw"},
                      health={"max_nonfinite_steps": 2})
    result = invoke("zero", "train", cfg, "--no-progress")
    one_line_error(result, "non-finite", status=1)
    assert any((out / "checkpoints").iterdir())
    assert not (out / "final").exists()


@pytest.mark.parametrize("options, words", [
    ({"add_digits": "x"}, ["add_digits", "integer"]),
    ({"add_digits": -1}, ["add_digits"]),
    ({"mul_share": 2}, ["mul_share"]),
    ({"test_share": 1.0}, ["test_share"]),
    ({"nonsense": 1}, ["nonsense"]),
])
def test_bad_task_options_are_one_line(tmp_path, tiny_model_dir, options, words):
    cfg = rlvr_config(tmp_path, tiny_model_dir, tmp_path / "run",
                      task={"name": "arithmetic", "options": options})
    one_line_error(invoke("rlvr", "train", cfg), *words)


def test_countdown_that_cannot_make_a_puzzle_raises_instead_of_hanging():
    with pytest.raises(ValueError, match="max_target"):
        make_task("countdown", max_target=0)
    with pytest.raises(ValueError, match="count"):
        make_task("countdown", count=0)
    task = make_task("countdown", count=1, max_number=1000, max_target=1, max_tries=50)
    import random

    with pytest.raises(ValueError, match="cannot make a puzzle"):
        for seed in range(20):  # count=1 reaches target 1 only when it draws a 1
            task.sample("train", random.Random(seed))


def test_no_test_split_with_eval_is_one_line(tmp_path, tiny_model_dir):
    cfg = rlvr_config(tmp_path, tiny_model_dir, tmp_path / "run", train={"steps": 1},
                      task={"name": "arithmetic", "options": {"test_share": 0}},
                      eval={"every": 1, "prompts": 2})
    one_line_error(invoke("rlvr", "train", cfg), "test split")


@pytest.mark.parametrize("args, words", [
    (["--prompts", "0"], ["--prompts"]),
    (["--top-p", "0"], ["--top-p"]),
    (["--temperature", "-1"], ["--temperature"]),
    (["--k", "0"], ["--k"]),
])
def test_eval_arguments_are_checked(tiny_model_dir, args, words):
    one_line_error(invoke("rlvr", "eval", "--model", tiny_model_dir, "--task", "arithmetic",
                          *args), *words)


def test_model_path_that_is_a_file_and_passk_checks_every_model_first(tmp_path, tiny_model_dir):
    weights = tiny_model_dir / "config.json"
    one_line_error(invoke("rlvr", "eval", "--model", weights, "--task", "arithmetic"), "a file")
    result = invoke("rlvr", "passk", "--model", tiny_model_dir, "--model", tmp_path / "nope",
                    "--task", "arithmetic", "--out", tmp_path / "p.png", "--prompts", "2")
    one_line_error(result, "nope")
    assert str(tiny_model_dir) + ":" not in result.stdout  # nothing evaluated first


def test_plot_into_a_folder_goes_inside_it(tmp_path, tiny_model_dir):
    folder = tmp_path / "plots"
    folder.mkdir()
    result = invoke("rlvr", "eval", "--model", tiny_model_dir, "--task", "arithmetic",
                    "--prompts", "2", "--plot", folder)
    assert result.exit_code == 0, result.output
    assert (folder / "pass_at_k.png").is_file() and not (tmp_path / "plots.png").exists()


def test_bad_value_on_the_command_line_is_blamed_on_the_command_line(tmp_path, tiny_model_dir):
    cfg = rlvr_config(tmp_path, tiny_model_dir, tmp_path / "run")
    with pytest.raises(ConfigError, match="command line"):
        load_config(RLVRConfig, cfg, ["train.lr=abc"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "train": {"lr": "abc"}}))
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(RLVRConfig, bad, ["train.steps=2"])


def test_zero_train_usage_errors_exit_2(tmp_path):
    cfg = zero_config(tmp_path, tmp_path / "z")
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "mine.txt").write_text("x")
    one_line_error(invoke("zero", "train", cfg, "--no-progress"), "did not write")
    one_line_error(invoke("zero", "train", cfg, "train.iterations=0"), "iterations")


def test_zero_move_errors_are_short():
    one_line_error(invoke("zero", "move", "--moves", "44", "--simulations", "1000000000"),
                   "--simulations")
    line = one_line_error(invoke("zero", "move", "--moves", "4" * 100_000))
    assert len(line) < 200


def test_progress_prints_whole_lines_when_not_a_terminal():
    out, now = io.StringIO(), [0.0]
    bar = StepProgress(100, "grpo arithmetic", fields=("reward",), stream=out, every_s=10,
                       clock=lambda: now[0])
    for step in range(1, 101):
        now[0] += 1.0
        bar.update(step, {"reward": 0.5})
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 11  # the first step, one per 10 s, and the end
    assert lines[-1].startswith("grpo arithmetic: step 100/100 (100%)") and "ETA" in lines[-1]
    assert "reward 0.5" in lines[0]


def test_progress_in_an_80_column_terminal_keeps_step_and_eta(monkeypatch):
    import re

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("COLUMNS", "80")
    out = Terminal()
    bar = StepProgress(1000, "grpo arithmetic-with-a-long-name", stream=out,
                       fields=("reward", "pass@1", "entropy", "kl", "tok/s"))
    bar.update(437, {"reward": 0.41, "pass@1": 0.5, "entropy": 1.2, "kl": 0.001, "tok/s": 1e4})
    bar.close()
    last = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue()).split("\r")[-1].strip()
    assert "437/1000" in last and "ETA" in last and len(last) <= 80


def test_step_undo_restores_weights_optimiser_and_schedule_in_place():
    import torch

    from rlscale.runtime.health import StepUndo

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    frozen = torch.nn.Linear(4, 4)
    frozen.requires_grad_(False)
    model.append(frozen)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    undo = StepUndo(model, optimizer, scheduler)

    def step():
        model(torch.randn(8, 4)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

    undo.save()  # before the first step: no optimiser state yet
    step()
    undo.restore()
    assert not optimizer.state  # the undone first step's state is gone again
    step()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [optimizer.state[p]["exp_avg"].clone() for p in optimizer.state]
    lr = optimizer.param_groups[0]["lr"]
    undo.save()
    saved_buffers = [t.data_ptr() for t in undo._saved]
    step()
    undo.restore()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(optimizer.state[p]["exp_avg"], m)
               for p, m in zip(optimizer.state, moments, strict=True))
    assert optimizer.param_groups[0]["lr"] == lr and scheduler.last_epoch == 1
    undo.save()  # the same buffers again: copied into, not reallocated
    assert [t.data_ptr() for t in undo._saved] == saved_buffers
    # the frozen layer is never copied
    assert not any(k[0] == "param" and k[1].startswith("2.") for k in undo._keys)


@pytest.mark.parametrize("mode", ["check", "off"])
def test_the_guard_without_a_snapshot(tmp_path, tiny_model_dir, monkeypatch, mode):
    """health.nonfinite_guard=check copies nothing: non-finite weights stop the run at once
    (one line, the last checkpoint kept, resumable); off copies and tests nothing (a sane run
    here: what a diverging one does under `off` is the user's risk)."""
    import torch

    from rlscale.runtime import checkpoint as ckpt
    from rlscale.runtime.health import StepUndo

    real_step = torch.optim.AdamW.step
    calls = []

    def diverging_at_3(self, *args, **kwargs):
        real_step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 3 and mode == "check":
            with torch.no_grad():
                next(p for g in self.param_groups for p in g["params"]).fill_(float("nan"))

    saves = []
    real_save = StepUndo.save
    monkeypatch.setattr(StepUndo, "save", lambda self: saves.append(1) or real_save(self))
    monkeypatch.setattr(torch.optim.AdamW, "step", diverging_at_3)
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 5},
                      checkpoint={"every": 2, "keep": 3},
                      health={"nonfinite_guard": mode})
    result = invoke("rlvr", "train", cfg)
    assert saves == []  # no snapshot copied in either mode
    if mode == "off":
        assert result.exit_code == 0, result.output
        assert steps_of(run) == [1, 2, 3, 4, 5]
        return
    line = one_line_error(result, "step 3", "'check'", "--resume", status=1)
    assert str(run) in line
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000002"]
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    result = invoke("rlvr", "train", cfg, "--resume")
    assert result.exit_code == 0, result.output
    assert steps_of(run) == [1, 2, 3, 4, 5]
