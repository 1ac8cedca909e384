"""The asynchronous fleets on an embedded Ray cluster: staleness bound, a killed worker,
every prompt group trained on exactly once, no process left behind."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the fleet tests need Ray (pip install 'rlscale[ray]')")

from processes import alive, descendants, kill_after_logged_steps  # noqa: E402
from rlscale.config import load_config  # noqa: E402
from rlscale.rlvr.config import RLVRConfig  # noqa: E402
from rlscale.rlvr.loop import RLVRRun  # noqa: E402

STEPS, PROMPTS, G = 6, 4, 4


def config(tmp_path: Path, model_dir: Path, mode: str, k: int, **extra) -> RLVRConfig:
    overrides = [f"run_dir={tmp_path / 'run'}", f"model.path={model_dir}",
                 "task.options={add_digits: 2}", "loss.kl_coef=0.0",
                 f"rollout.prompts_per_step={PROMPTS}", f"rollout.group_size={G}",
                 "rollout.max_new_tokens=6", "rollout.slots=8", f"train.steps={STEPS}",
                 "train.lr=1e-3", "train.threads=1", "checkpoint.every=0",
                 "tensorboard=false", "progress=false", f"runtime.mode={mode}",
                 f"runtime.max_staleness={k}", "runtime.inference_workers=2",
                 *[f"{key}={value}" for key, value in extra.items()]]
    return load_config(RLVRConfig, None, overrides)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_inflight_run_survives_a_killed_worker(tmp_path, tiny_model_dir):
    cfg = config(tmp_path, tiny_model_dir, "inflight", k=1)
    earlier = descendants(os.getpid())  # e.g. a verifier worker an earlier test started
    run = RLVRRun(cfg)
    seen: set[int] = set()
    killed: list[int] = []

    def killer():
        while run.fleet is None or run.step < 1:
            time.sleep(0.01)
        pid = run.fleet.worker_pids()[0]  # mid-run: requests are out on both workers
        seen.update(descendants(os.getpid()))
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        while run.fleet is not None and run.step < STEPS:
            seen.update(descendants(os.getpid()))
            time.sleep(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    final = run.train()
    thread.join(timeout=10)
    assert (final / "config.json").is_file()
    assert killed, "the worker was never killed"

    accounting = run.fleet.accounting
    assert accounting.worker_restarts >= 1
    # every prompt group trained on exactly once; the rest dropped (counted) or in flight
    assert len(accounting.trained_group_ids) == STEPS * PROMPTS
    assert len(set(accounting.trained_group_ids)) == len(accounting.trained_group_ids)
    assert accounting.balanced(run.fleet.checkpoint_state()["ledger"]["in_flight"])
    assert accounting.dropped_uniform == 0  # grpo: no dynamic sampling

    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert row["staleness/lag_max"] <= 1  # the bound, in every trained batch
        assert row["fleet/ledger_trained"] == row["step"] * PROMPTS
        assert row["fleet/ledger_admitted"] == sum(row[f"fleet/ledger_{k}"] for k in (
            "trained", "dropped_stale", "dropped_uniform", "discarded_on_resume", "in_flight"))
        assert row["fleet/worker_restarts"] >= 0
    assert rows[-1]["fleet/worker_restarts"] >= 1

    time.sleep(1.0)  # Ray's processes exit asynchronously after shutdown
    left = [pid for pid in seen - earlier if alive(pid)]
    assert not left, f"processes left behind: {left}"


def test_async_k0_is_on_policy_and_two_factors_are_logged(tmp_path, tiny_model_dir):
    """k = 0: every token trained on was drawn by exactly the weights being trained, so
    pi_old/mu is the engine mismatch alone (bf16 engine vs fp32 trainer: measurably > 0)."""
    cfg = config(tmp_path, tiny_model_dir, "async", k=0, **{"train.steps": 3,
                                                            "rollout.dtype": "bfloat16",
                                                            "loss.is_correction": "tis"})
    RLVRRun(cfg).train()
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 3
    for row in rows:
        assert row["staleness/lag_max"] == 0
        # pi_old: the trainer's own fp32 forward (one update per batch: the training one)
        assert row["policy/old_logp_forward_skipped"] == 1.0
        assert row["behaviour/engine_kl"] > 0
        assert "behaviour/stale_kl" not in row
        assert row["behaviour/stale_token_share"] == 0.0
    for row in rows[1:]:  # each version timed learner -> a worker serving it (k = 0: one a step)
        assert 0 < row["time/weight_pack_s"] <= row["time/publish_s"] < 60
        assert 0 < row["time/weight_load_s"] < row["time/publish_s"]


def test_ppo_with_a_critic_trains_behind_the_async_fleet(tmp_path, tiny_model_dir):
    """objective ppo on the fleet: one completion per prompt, the critic's GAE and update in
    the learner, whatever the source of the batch."""
    cfg = config(tmp_path, tiny_model_dir, "async", k=1, **{
        "train.steps": 3, "objective": "ppo", "rollout.group_size": 1,
        "rollout.prompts_per_step": 8})
    RLVRRun(cfg).train()
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 3
    for row in rows:
        assert row["staleness/lag_max"] <= 1
        assert row["critic/value_loss"] >= 0 and "critic/value_error_first_third" in row


def test_killed_trainer_resumes_and_counts_what_was_in_flight(tmp_path, tiny_model_dir):
    """SIGKILL the whole training process mid-run: Ray's processes go with it, and
    `--resume` continues from the last checkpoint, every step logged exactly once."""
    import subprocess
    import sys

    import yaml

    steps = 8
    cfg = config(tmp_path, tiny_model_dir, "inflight", k=1,
                 **{"train.steps": steps, "checkpoint.every": 2})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    cmd = [sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(path)]
    run_dir = tmp_path / "run"
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    # past the checkpoint of step 2, mid-way to the next
    family = kill_after_logged_steps(first, run_dir / "metrics.jsonl", 3)
    resumed = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # Ray's agents alone would notice the dead raylet by polling and retry a dead GCS for a
    # minute or more; the reaper (runtime/reaper.py) ends the whole cluster within seconds.
    deadline = time.time() + 20
    while time.time() < deadline and any(alive(pid) for pid in family):
        time.sleep(1.0)
    left = [pid for pid in family if alive(pid)]
    assert not left, f"processes outlived the killed trainer: {left}"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for row in rows:  # the ledger balances over the kill: the lost groups are discarded
        assert row["fleet/ledger_trained"] == row["step"] * cfg.rollout.prompts_per_step
        assert row["fleet/ledger_admitted"] == sum(row[f"fleet/ledger_{k}"] for k in (
            "trained", "dropped_stale", "dropped_uniform", "discarded_on_resume", "in_flight"))
    after = [r for r in rows if r["fleet/discarded_on_resume"] > 0]
    assert after and after[0]["step"] <= 5  # counted from the first resumed step on
    assert all(r["staleness/lag_max"] <= 1 for r in rows)


def test_fleet_resume_discards_what_the_killed_run_had_in_flight():
    from rlscale.rlvr.fleet import FleetAccounting, fleet_resume

    at_checkpoint = FleetAccounting(admitted=30, trained=24, dropped_stale=2, dropped_uniform=1)
    saved = {"next_group": 30, "in_flight": 3, "ledger": at_checkpoint.ledger(3)}
    # the killed run admitted 5 more groups after the checkpoint (logged in its metrics)
    resumed = fleet_resume(saved, logged_admitted=35, trained=24)
    assert resumed.next_group == 35  # their ids are never reused
    acc = resumed.accounting
    assert (acc.admitted, acc.trained, acc.discarded_on_resume) == (35, 24, 3 + 5)
    assert acc.balanced(in_flight=0)
    # nothing logged beyond the checkpoint: only the in-flight groups are lost
    again = fleet_resume(saved, logged_admitted=0, trained=24)
    assert again.next_group == 30 and again.accounting.discarded_on_resume == 3
    assert again.accounting.balanced(in_flight=0)
    # a checkpoint from before the ledger was kept: rebuilt, balanced
    old = fleet_resume({"next_group": 30, "in_flight": 3}, logged_admitted=31, trained=24)
    assert old.accounting.balanced(in_flight=0) and old.next_group == 31
