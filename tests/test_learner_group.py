"""A learner group of 2 processes (FSDP2 over gloo) computes what 1 process computes: the
same weights after 5 steps for grpo, dapo, gspo and PPO (its critic too) with several
minibatches, epochs and micro-batches; global normalisation with uneven token counts across
ranks; and checkpoints that resume across a change of the number of processes."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp

from rlscale.rlvr import sharding
from rlscale.rlvr.batch import build_policy_batch
from rlscale.rlvr.config import TrainConfig
from rlscale.rlvr.critic import make_critic
from rlscale.rlvr.learner_group import LearnerRank, LearnerSpec, LocalLearner
from rlscale.rlvr.model import load_model
from rlscale.rlvr.objectives import PRESETS
from rlscale.rlvr.ranks import RankGroup
from rlscale.rlvr.step_loss import StepLoss
from rlscale.rlvr.trainer import PolicyTrainer

STEPS = 5


def step_batch(step: int, sequences: int = 8):
    """Random prompts and completions of very uneven lengths (so the two ranks' token
    counts differ), the advantages of groups of 4."""
    g = torch.Generator().manual_seed(100 + step)
    prompts = [torch.randint(4, 90, (int(n),), generator=g).tolist()
               for n in torch.randint(2, 12, (sequences,), generator=g)]
    lengths = torch.randint(1, 14, (sequences,), generator=g)
    width = int(lengths.max())
    completions = torch.randint(4, 90, (sequences, width), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    rewards = torch.randint(0, 2, (sequences,), generator=g).float().view(-1, 4)
    advantages = (rewards - rewards.mean(1, keepdim=True)).flatten()
    sampler = -torch.rand(sequences, width, generator=g) * mask
    return build_policy_batch(prompts, completions.masked_fill(mask == 0, 0), mask, advantages,
                              sampler, pad_token_id=0, policy_version=step)


ARMS = {
    "grpo": (PRESETS["grpo"], TrainConfig(lr=3e-3, epochs=2, minibatches=2, micro_batch_size=2)),
    "dapo": (PRESETS["dapo"], TrainConfig(lr=3e-3, epochs=2, minibatches=2,
                                          micro_batch_tokens=40)),
    "gspo": (PRESETS["gspo"], TrainConfig(lr=3e-3, epochs=1, minibatches=2, micro_batch_size=1)),
    "top_entropy": (replace(PRESETS["grpo"], entropy_top_rho=0.5, kl_coef=0.0),
                    TrainConfig(lr=3e-3, minibatches=2, pack=False)),
    "ppo": (PRESETS["ppo"], TrainConfig(lr=3e-3, epochs=2, minibatches=2, micro_batch_size=2)),
}


def spec_of(arm: str, model_dir, dtype: str = "float64") -> LearnerSpec:
    """In float64 by default: in float32, Adam turns rounding-level differences (any change
    of how rows are grouped, one process's micro-batch size too) into ~1e-4 relative weight
    differences after 5 steps, which would hide a real error of that size."""
    objective, train = ARMS[arm]
    return LearnerSpec(str(model_dir), dtype, objective, train, temperature=1.0,
                       compute_dtype="float32", with_reference=objective.kl_coef > 0,
                       device="cpu", threads=1)


def one_process(spec: LearnerSpec) -> tuple[dict[str, torch.Tensor], list[dict]]:
    model, _ = load_model(spec.model_path, spec.model_dtype)
    reference = None
    if spec.with_reference:
        reference, _ = load_model(spec.model_path, spec.model_dtype)
        reference.requires_grad_(False)
    critic = make_critic(spec.objective, spec.train, model, spec.compute_dtype)
    learner = LocalLearner(PolicyTrainer(model, reference, StepLoss(spec.objective, critic),
                                         spec.train, temperature=1.0))
    metrics = []
    for step in range(STEPS):
        batch = step_batch(step)
        result = learner.step(batch, seed=step)
        metrics.append({**result.metrics, **learner.update_stats(batch, result)})
    critic_state = {} if critic is None else critic.model.state_dict()
    return {**model.state_dict(), **{f"critic.{k}": v for k, v in critic_state.items()}}, metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, size: int, port: int, specs: list[LearnerSpec], out: str) -> None:
    torch.set_num_threads(1)
    learner = LearnerRank()
    learner.join(rank, size, "cpu", f"tcp://127.0.0.1:{port}")
    results = []
    try:
        for spec in specs:
            learner.build(spec)
            metrics = []
            for step in range(STEPS):
                batch = step_batch(step)
                learner.save_undo()  # as the guard does before every step (health snapshot)
                result = learner.step(batch, step)
                metrics.append({**result.metrics, **learner.update_stats(batch, result)})
            critic = learner.trainer.loss.critic
            critic_state = {} if critic is None else sharding.full_state_dict(critic.model)
            results.append(({**learner.full_state(),
                             **{f"critic.{k}": v for k, v in critic_state.items()}}, metrics))
        if rank == 0:
            torch.save(results, out)
    finally:
        learner.close()


def group_of(size: int, specs: list[LearnerSpec], tmp_path
             ) -> list[tuple[dict[str, torch.Tensor], list[dict]]]:
    """The state and metrics rank 0 of a `size`-process group reached for each spec (each
    rank a spawned process; an exception in one fails the test with its traceback)."""
    out = tmp_path / f"group_{size}.pt"
    mp.start_processes(_rank_main, args=(size, free_port(), specs, str(out)), nprocs=size,
                       join=True, start_method="spawn")
    return torch.load(out, weights_only=False)


def relative_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest relative difference of a tensor both hold (a saved folder keeps one of
    two tied weights)."""
    shared = a.keys() & b.keys()
    assert len(shared) >= len(b) - 1
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-12)) for k in shared)


def test_two_processes_reach_the_weights_of_one(tiny_model_dir, tmp_path):
    """Every arm (grpo, dapo, gspo, the top-entropy mask, PPO with its critic) in one
    2-process group."""
    specs = [spec_of(arm, tiny_model_dir) for arm in ARMS]
    start = load_model(tiny_model_dir, "float64")[0].state_dict()
    for arm, spec, (grouped, group_metrics) in zip(ARMS, specs, group_of(2, specs, tmp_path),
                                                   strict=True):
        single, single_metrics = one_process(spec)
        assert set(grouped) == set(single), arm
        assert relative_gap(single, start) > 1e-3, arm  # the steps moved the weights
        assert relative_gap(grouped, single) < 1e-5, arm
        for one, two in zip(single_metrics, group_metrics, strict=True):
            keys = ("policy/grad_norm", "policy/entropy", "policy/kl_new_old", "loss/loss",
                    *(("critic/value_loss", "critic/grad_norm", "critic/explained_variance")
                      if arm == "ppo" else ()))
            for key in keys:
                assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-7, nan_ok=True), (arm, key)
        if arm == "ppo":  # the critic trained, and to the same weights
            assert any(k.startswith("critic.") for k in grouped)


def test_a_rank_share_balances_tokens_and_covers_every_row():
    lengths = torch.tensor([30, 1, 1, 1, 1, 1, 1, 40])
    index = torch.tensor([7, 0, 1, 2, 3, 4, 5, 6])
    shares = [RankGroup(r, 2).share(index, lengths) for r in range(2)]
    assert shares == [(0, 1), (1, 8)]  # 40 tokens alone; the other 36 together
    assert RankGroup().share(index, lengths) == (0, 8)
    three = [RankGroup(r, 3).share(index[:2], lengths) for r in range(3)]
    assert three[0][0] == 0 and three[-1][1] == 2  # a rank may get no rows
    assert all(a[1] == b[0] for a, b in zip(three, three[1:], strict=False))


# -- whole runs: `rlscale rlvr train` with train.learner_processes ----------------------------

RUN_STEPS = 6


def run_config(tmp_path, model_dir, name: str, processes: int, steps: int = RUN_STEPS,
               objective: str = "grpo"):
    """A short GRPO (or `objective`) run whose advantages are not all zero from the first
    step (a length penalty), a checkpoint every 2 steps; its own folder under tmp_path."""
    import yaml

    cfg = {"run_dir": str(tmp_path / name), "model": {"path": str(model_dir)},
           "task": {"name": "arithmetic", "options": {"add_digits": 2}}, "objective": objective,
           "loss": {"kl_coef": 0.01, "length_penalty_per_token": 0.05},
           "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
           "train": {"steps": steps, "lr": 1e-3, "minibatches": 2, "seed": 3, "threads": 1,
                     "learner_processes": processes, "post_update_stats_every": 2,
                     # float32 named: `auto` picks bfloat16 on CPUs that multiply it faster
                     # (AMX), where 1 and 2 processes round differently, a sampled token
                     # flips and the runs part ~1e-2 (seen in CI, 2026-12-06)
                     "compute_dtype": "float32"},
           "checkpoint": {"every": 2, "keep": 2}, "tensorboard": False, "progress": False}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(config, *extra: str, check: bool = True):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(config),
                           *extra], capture_output=True, text=True, timeout=600, check=check,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def unbroken_run(tiny_model_dir, tmp_path_factory):
    """One process, RUN_STEPS steps in one go: what every broken-up run must reach."""
    tmp_path = tmp_path_factory.mktemp("unbroken")
    train(run_config(tmp_path, tiny_model_dir, "one", 1))
    return tmp_path / "one"


# 1 -> 2 is slow-marked (~20 s): the PPO test below resumes 2 -> 1 -> 2 in the default run
@pytest.mark.parametrize("first,then", [(2, 1), pytest.param(1, 2, marks=pytest.mark.slow)])
def test_a_run_resumes_with_another_number_of_learner_processes(first, then, unbroken_run,
                                                                tiny_model_dir, tmp_path):
    config = run_config(tmp_path, tiny_model_dir, "run", first, steps=3)
    train(config)
    train(config, f"train.learner_processes={then}", f"train.steps={RUN_STEPS}", "--resume")
    reference = final_weights(unbroken_run)
    assert relative_gap(final_weights(tmp_path / "run"), reference) < 1e-5
    assert relative_gap(reference, load_model(tiny_model_dir, "float32")[0].state_dict()) > 1e-4


@pytest.fixture(scope="module")
def unbroken_ppo_run(tiny_model_dir, tmp_path_factory):
    """PPO (a learned critic) in one process, RUN_STEPS steps in one go."""
    tmp_path = tmp_path_factory.mktemp("unbroken_ppo")
    train(run_config(tmp_path, tiny_model_dir, "one", 1, objective="ppo"))
    return tmp_path / "one"


def test_ppo_resumes_its_critic_from_2_processes_to_1_and_back(unbroken_ppo_run,
                                                               tiny_model_dir, tmp_path):
    """The critic's weights and optimiser, saved whole and sharded by a group (loaded by one
    process) and whole by one process (loaded by a group), continue the run exactly: the
    policy reaches the unbroken run's weights."""
    config = run_config(tmp_path, tiny_model_dir, "run", 2, steps=2, objective="ppo")
    train(config)
    train(config, "train.learner_processes=1", "train.steps=4", "--resume")
    train(config, "train.learner_processes=2", f"train.steps={RUN_STEPS}", "--resume")
    # fp32 with a critic: 1.05e-5 apart on an AVX-512 Xeon (2026-12-06), where the run moved
    # the weights 0.18 from the start (asserted > 1e-2 below: a resume that loses the run's
    # state lands nowhere near)
    final = final_weights(tmp_path / "run")
    assert relative_gap(final, final_weights(unbroken_ppo_run)) < 5e-5
    assert relative_gap(final, load_model(tiny_model_dir, "float32")[0].state_dict()) > 1e-2


@pytest.mark.slow
def test_two_learner_processes_killed_mid_run_resume_exactly(unbroken_run, tiny_model_dir,
                                                             tmp_path):
    import os
    import subprocess
    import sys
    import time

    from processes import alive, kill_after_logged_steps
    from rlscale.runtime.metrics import read_metrics

    config = run_config(tmp_path, tiny_model_dir, "run", 2)
    cmd = [sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(config)]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    # past the checkpoint of step 2, mid-way to the next
    family = kill_after_logged_steps(first, tmp_path / "run" / "metrics.jsonl", 3)
    resumed = train(config, "--resume", check=False)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    deadline = time.time() + 20
    while time.time() < deadline and any(alive(pid) for pid in family):
        time.sleep(1.0)
    assert not [pid for pid in family if alive(pid)], "learner ranks outlived the killed run"
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == list(range(1, RUN_STEPS + 1))
    assert relative_gap(final_weights(tmp_path / "run"), final_weights(unbroken_run)) < 1e-5


# slow (~50 s): the launch path only; the group's arithmetic is covered by the Ray tests above
@pytest.mark.slow
def test_torchrun_starts_the_learner_ranks_and_rank_0_runs_the_loop(unbroken_run,
                                                                    tiny_model_dir, tmp_path):
    import os
    import subprocess
    import sys

    config = run_config(tmp_path, tiny_model_dir, "run", 2)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                           "-m", "rlscale.cli", "rlvr", "train", str(config)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert relative_gap(final_weights(tmp_path / "run"), final_weights(unbroken_run)) < 1e-5
    wrong = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                            "-m", "rlscale.cli", "rlvr", "train", str(config),
                            "train.learner_processes=3", "--overwrite"],
                           capture_output=True, text=True, timeout=600)
    assert wrong.returncode != 0
    assert "torchrun started 2 processes but train.learner_processes is 3" in wrong.stderr
