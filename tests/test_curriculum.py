"""The learnability curriculum: levels found from the task, draws weighted by p(1-p) of each
level's running success rate, its state saved and resumed; uniform leaves the task's own
sampler alone."""

import json
import random

import pytest
import torch

from rlscale.config import load_config
from rlscale.rlvr.config import RLVRConfig
from rlscale.rlvr.curriculum import FLOOR, LearnabilityCurriculum, learnability, make_curriculum
from rlscale.rlvr.loop import RLVRRun
from rlscale.rlvr.tasks import make_task

TASK = make_task("long_arithmetic", min_terms=2, max_terms=5, max_digits=1)


def test_levels_come_from_the_task_and_weights_follow_learnability():
    curriculum = LearnabilityCurriculum(TASK, ema=0.5, seed=0)
    assert curriculum.levels == [2, 3, 4, 5]
    assert curriculum.weights() == [0.25] * 4            # unknown: p = 0.5 everywhere
    assert learnability(0.0) == learnability(1.0) == FLOOR
    assert learnability(0.5) == 0.25 and learnability(0.9) == pytest.approx(0.09)


def test_draws_go_where_the_groups_succeed_half_the_time():
    curriculum = LearnabilityCurriculum(TASK, ema=1.0, seed=0)
    examples = [TASK.sample("train", random.Random(i)) for i in range(200)]
    by_level = {level: next(e for e in examples if TASK.difficulty(e) == level)
                for level in (2, 3, 4, 5)}
    # level 2 always solved, 3 half the time, 4 and 5 never: groups of 4
    rewards = torch.tensor([1.0] * 4 + [1.0, 0.0, 1.0, 0.0] + [0.0] * 8)
    figures = curriculum.update([by_level[2], by_level[3], by_level[4], by_level[5]],
                                rewards, group_size=4)
    assert curriculum.rates == {2: 1.0, 3: 0.5, 4: 0.0, 5: 0.0}
    assert figures["curriculum/rate_3"] == 0.5
    assert figures["curriculum/weight_3"] == pytest.approx(0.25 / (0.25 + 3 * FLOOR))
    drawn = curriculum.sample(random.Random(1), 400)
    share = sum(TASK.difficulty(e) == 3 for e in drawn) / len(drawn)
    assert share > 0.7 and all(e.prompt.endswith("=") for e in drawn)
    # a slow average: the newest step moves a rate by `ema` of the way
    slow = LearnabilityCurriculum(TASK, ema=0.25, seed=0)
    slow.update([by_level[2]], torch.ones(4), group_size=4)
    assert slow.rates[2] == pytest.approx(0.5 + 0.25 * 0.5)


def test_the_state_round_trips_and_checks_its_levels():
    curriculum = LearnabilityCurriculum(TASK, ema=0.5, seed=0)
    curriculum.rates[4] = 0.9
    other = LearnabilityCurriculum(TASK, ema=0.5, seed=1)
    other.load(curriculum.state())
    assert other.rates == curriculum.rates
    narrower = LearnabilityCurriculum(make_task("long_arithmetic", min_terms=2, max_terms=3),
                                      ema=0.5, seed=0)
    with pytest.raises(ValueError, match="curriculum levels"):
        narrower.load(curriculum.state())


def test_uniform_is_the_tasks_sampler_and_a_task_without_levels_is_refused():
    assert make_curriculum("uniform", TASK, ema=0.3, seed=0) is None
    with pytest.raises(ValueError, match="task 'arithmetic' has none"):
        make_curriculum("learnability", make_task("arithmetic"), ema=0.3, seed=0)


def _config(tmp_path, model_dir, *extra):
    return load_config(RLVRConfig, None, [
        f"model.path={model_dir}", f"run_dir={tmp_path / 'run'}", "task.name=long_arithmetic",
        "task.options={min_terms: 2, max_terms: 4, max_digits: 1}",
        "rollout.curriculum=learnability", "rollout.prompts_per_step=4",
        "rollout.group_size=2", "rollout.max_new_tokens=8", "train.steps=2", "eval.every=0",
        "checkpoint.every=1", "loss.kl_coef=0", "tensorboard=false", "progress=false", *extra])


def test_a_run_logs_its_curriculum_and_resumes_it(tmp_path, tiny_model_dir):
    run = RLVRRun(_config(tmp_path, tiny_model_dir))
    record = run.train_step()
    assert {"curriculum/rate_2", "curriculum/weight_4", "curriculum/mean_level"} <= set(
        record.metrics)
    run.curriculum.rates[3] = 0.123  # as if learned
    run.step += 1
    run.save_checkpoint()
    run.lock.release()
    resumed = RLVRRun(_config(tmp_path, tiny_model_dir), resume=True)
    assert resumed.curriculum.rates[3] == 0.123
    resumed.lock.release()


def test_the_async_fleet_draws_by_the_curriculum_and_saves_it(tmp_path, tiny_model_dir):
    """Behind the fleet: prompts are drawn by the curriculum as groups are admitted, every P
    finished groups are folded in as a step, the figures are logged, and the checkpoint
    holds the curriculum the fleet moved."""
    pytest.importorskip("ray")
    cfg = _config(tmp_path, tiny_model_dir, "runtime.mode=async", "runtime.max_staleness=1",
                  "runtime.inference_workers=1", "rollout.slots=4", "train.steps=3",
                  "train.threads=1")
    run = RLVRRun(cfg)
    run.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    logged = [r for r in rows if "curriculum/weight_2" in r]
    assert logged and all(abs(sum(r[f"curriculum/weight_{lvl}"] for lvl in (2, 3, 4)) - 1)
                          < 1e-9 for r in logged)
    assert run.curriculum.rates != {2: 0.5, 3: 0.5, 4: 0.5}  # the fleet's groups moved it
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_000002" / "trainer_state.pt",
                       weights_only=False)
    assert state["curriculum"]["levels"] == [2, 3, 4]
