"""Parts 2 and 3: resume is config-locked; a torn checkpoint falls back to the one before."""

import json

from faults_helpers import invoke, one_line_error, rlvr_config, steps_of

from rlscale.runtime import rundir


def test_resume_refuses_math_changes_and_records_allowed_ones(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    # float32 pinned: under `auto` a resume at another thread count may resolve the other
    # precision (a free field, recorded as a change too), which this test does not count.
    cfg = rlvr_config(tmp_path, tiny_model_dir, run,
                      train={"steps": 2, "compute_dtype": "float32"})
    assert invoke("rlvr", "train", cfg).exit_code == 0
    recorded = (run / "config.yaml").read_text()
    line = one_line_error(invoke("rlvr", "train", cfg, "train.steps=3", "train.lr=0.5",
                                 "objective=dapo", "--resume"), "train.lr", "objective",
                          "--allow-config-change")
    assert "0.5" in line
    assert (run / "config.yaml").read_text() == recorded  # the record still describes the run
    # steps below the steps done: refused, final/ untouched
    final = (run / "final" / "model.safetensors").read_bytes()
    one_line_error(invoke("rlvr", "train", cfg, "train.steps=1", "--resume"), "below")
    assert (run / "final" / "model.safetensors").read_bytes() == final
    # speed and logging fields, and more steps, pass; each change is recorded with its step
    result = invoke("rlvr", "train", cfg, "train.steps=3", "train.threads=2", "--resume")
    assert result.exit_code == 0, result.output
    result = invoke("rlvr", "train", cfg, "train.steps=4", "train.lr=5e-4", "--resume",
                    "--allow-config-change")
    assert result.exit_code == 0, result.output
    assert steps_of(run) == [1, 2, 3, 4]
    rows = [json.loads(x) for x in (run / "config_changes.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 3 and set(rows[0]["changes"]) == {"train.steps", "train.threads"}
    assert rows[1]["step"] == 4 and rows[1]["changes"]["train.lr"]["free"] is False
    # already at train.steps: nothing to do, nothing rewritten
    final = (run / "final" / "model.safetensors").read_bytes()
    result = invoke("rlvr", "train", cfg, "train.steps=4", "train.lr=5e-4", "--resume")
    assert result.exit_code == 0 and "nothing to do" in result.output
    assert (run / "final" / "model.safetensors").read_bytes() == final


def test_config_changes_are_listed_by_dotted_key():
    changes = rundir.config_changes({"train": {"lr": 1, "steps": 2}, "progress": True},
                                    {"train": {"lr": 2, "steps": 3}, "progress": False},
                                    ("train.steps", "progress"))
    assert [(c.key, c.free) for c in changes] == [("progress", True), ("train.lr", False),
                                                  ("train.steps", True)]


def test_torn_last_checkpoint_falls_back_to_the_previous_one(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 4},
                      checkpoint={"every": 1, "keep": 3})
    assert invoke("rlvr", "train", cfg, "train.steps=3").exit_code == 0
    reference = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    last = run / "checkpoints" / "step_000003"
    (last / "trainer_state.pt").write_bytes((last / "trainer_state.pt").read_bytes()[:100])
    middle = run / "checkpoints" / "step_000002"
    weights = middle / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    (run / "checkpoints" / ".tmp-step_000004-dead").mkdir()  # a killed run's leftover
    result = invoke("rlvr", "train", cfg, "--resume")
    assert result.exit_code == 0, result.output
    assert "step_000003" in result.stderr and "step_000002" in result.stderr
    assert "truncated" in result.stderr
    assert steps_of(run) == [1, 2, 3, 4]
    again = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(again[:3], reference, strict=True):  # steps 2-3 redone identically
        assert a["reward/mean"] == b["reward/mean"]
    assert not list((run / "checkpoints").glob(".tmp-*"))


def test_every_checkpoint_unusable_is_one_line(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    cfg = rlvr_config(tmp_path, tiny_model_dir, run, train={"steps": 1},
                      checkpoint={"every": 1, "keep": 1})
    assert invoke("rlvr", "train", cfg).exit_code == 0
    (run / "checkpoints" / "step_000001" / "model.safetensors").write_bytes(b"\x00" * 4)
    one_line_error(invoke("rlvr", "train", cfg, "train.steps=2", "--resume"),
                   "no usable checkpoint")
