"""PPO's learned critic: GAE against a hand computation, the clipped value loss, the value
model's fit on a tiny batch, and `objective: ppo` end to end (config, checkpoint, resume)."""

import pytest
import torch

from rlscale.config import ConfigError, load_config
from rlscale.rlvr import critic as C
from rlscale.rlvr.batch import build_policy_batch
from rlscale.rlvr.config import RLVRConfig
from rlscale.rlvr.loop import RLVRRun
from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.objectives import PRESETS, Aggregation, Objective
from rlscale.rlvr.step_loss import StepLoss


def test_terminal_reward_lands_on_each_rows_last_sampled_token():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    out = C.terminal_rewards(torch.tensor([1.0, -0.5, 2.0]), mask)
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, -0.5, 0.0],
                                          [0.0, 0.0, 0.0, 0.0]]))


def test_gae_matches_a_hand_computation():
    # one trace of 3 tokens, reward 1 at the end, gamma 0.9, lambda 0.8:
    #   delta_2 = 1 - 0.8 = 0.2                  A_2 = 0.2
    #   delta_1 = 0.9 * 0.8 - 0.2 = 0.52         A_1 = 0.52 + 0.72 * 0.2 = 0.664
    #   delta_0 = 0.9 * 0.2 - 0.5 = -0.32        A_0 = -0.32 + 0.72 * 0.664 = 0.15808
    values = torch.tensor([[0.5, 0.2, 0.8, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    rewards = C.terminal_rewards(torch.tensor([1.0]), mask)
    adv, ret = C.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[0.15808, 0.664, 0.2, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.65808, 0.864, 1.0, 0.0]]))
    # a token a tool wrote (outside the mask) is not a step: the same trace with a hole
    holed_values = torch.tensor([[0.5, 9.0, 0.2, 0.8]])
    holed_mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    adv2, _ = C.gae(C.terminal_rewards(torch.tensor([1.0]), holed_mask), holed_values,
                    holed_mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv2, torch.tensor([[0.15808, 0.0, 0.664, 0.2]]))
    # gamma = lambda = 1 (the ppo preset): every token's advantage is R - V(s_t)
    adv3, ret3 = C.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv3, torch.tensor([[0.5, 0.8, 0.2, 0.0]]))
    assert torch.allclose(ret3, mask)  # the return is R at every token


def test_value_loss_clips_a_move_past_the_range_only_when_that_helps():
    old = torch.tensor([[0.0, 0.0]])
    new = torch.tensor([[0.5, 0.1]], requires_grad=True)
    returns = torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    loss, bit = C.value_loss(new, old, returns, mask, clip=0.2, aggregate=Aggregation())
    # token 0 moved 0.5 (clipped to 0.2: error 0.64 > 0.25, the clipped term counts);
    # token 1 moved 0.1 inside the range: 0.81 either way
    assert float(loss.detach()) == pytest.approx(0.5 * (0.64 + 0.81) / 2)
    assert float(bit) == pytest.approx(0.5)
    loss.backward()
    assert new.grad[0, 0] == 0.0 and new.grad[0, 1] != 0.0  # no gradient through the clip
    unclipped, _ = C.value_loss(new, old, returns, mask, clip=0.0, aggregate=Aggregation())
    assert float(unclipped.detach()) == pytest.approx(0.5 * (0.25 + 0.81) / 2)


def test_whitened_advantages_are_standard_on_the_mask_and_zero_off_it():
    adv = torch.tensor([[1.0, 2.0, 3.0, 7.0], [4.0, 5.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    out = C.whiten(adv, mask)
    picked = out[mask > 0]
    assert float(picked.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(picked.std()) == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(out[mask == 0], torch.zeros(3))


def _batch(rows=16, seed=0):
    """Prompts whose first token decides the reward: a critic can learn it from the prefix."""
    g = torch.Generator().manual_seed(seed)
    prompts = [[int(t) for t in torch.randint(5, 20, (4,), generator=g)] for _ in range(rows)]
    completions = torch.randint(5, 20, (rows, 6), generator=g)
    mask = torch.ones(rows, 6)
    mask[::3, 4:] = 0
    rewards = torch.tensor([1.0 if p[0] >= 12 else 0.0 for p in prompts])
    return build_policy_batch(prompts, completions, mask, rewards, torch.zeros(rows, 6),
                              pad_token_id=0, policy_version=0)


def test_the_critics_value_loss_falls_on_a_tiny_batch():
    torch.manual_seed(0)
    policy = build_tiny_model("tiny")[0]
    critic = C.Critic(policy, lr=3e-3, weight_decay=0.0, grad_clip=1.0, value_clip=0.2,
                      epochs=1, minibatches=2)
    batch = _batch()
    values = critic.values(batch)
    assert torch.equal(values, torch.zeros_like(values))  # a zero head predicts 0
    # the copy is the critic's own: training it leaves the policy as it was
    before = [p.detach().clone() for p in policy.parameters()]
    losses = []
    for _ in range(30):
        old = critic.values(batch)
        _, returns = C.gae(C.terminal_rewards(batch.advantages, batch.mask), old, batch.mask,
                           gamma=1.0, lam=1.0)
        losses.append(critic.fit(batch, C.CriticTargets(old, returns),
                                 torch.Generator().manual_seed(0))["critic/value_loss"])
    print(f"critic value loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert losses[-1] < 0.5 * losses[0]
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    fitted = critic.values(batch)
    high = batch.advantages > 0
    assert float(fitted[high][:, :1].mean()) > float(fitted[~high][:, :1].mean()) + 0.3


def test_step_loss_with_a_critic_trains_on_per_token_advantages():
    torch.manual_seed(0)
    policy = build_tiny_model("tiny")[0]
    objective = PRESETS["ppo"]
    critic = C.Critic(policy, lr=1e-3, weight_decay=0.0, grad_clip=1.0, value_clip=0.2,
                      epochs=1, minibatches=1)
    loss = StepLoss(objective, critic)
    batch = _batch()
    shaped, targets, figures = loss.prepare(batch)
    assert shaped.advantages.shape == batch.mask.shape          # per token
    assert torch.equal(shaped.advantages * (1 - batch.mask), torch.zeros_like(batch.mask))
    assert torch.equal(targets.returns, C.terminal_rewards(batch.advantages, batch.mask)
                       .flip(1).cumsum(1).flip(1) * batch.mask)  # gamma 1: R at every token
    assert {"critic/explained_variance", "critic/value_error_first_third"} <= set(figures)
    assert set(loss.finish(shaped, targets, None)) >= {"critic/value_loss"}
    with pytest.raises(ValueError, match="holds none"):  # a group's driver never steps
        StepLoss(objective).prepare(batch)
    with pytest.raises(ValueError, match="without critic set"):
        StepLoss(PRESETS["grpo"], critic)
    with pytest.raises(ValueError, match="ratio_level"):
        Objective(critic=True, ratio_level="sequence")


def _ppo_config(tmp_path, model_dir, *extra):
    return load_config(RLVRConfig, None, [
        "objective=ppo", f"model.path={model_dir}", f"run_dir={tmp_path / 'ppo'}",
        "task.name=arithmetic", "task.options={add_digits: 1, mul_share: 0.0}",
        "rollout.prompts_per_step=8", "rollout.group_size=1", "rollout.max_new_tokens=6",
        "train.steps=2", "train.minibatches=2", "eval.every=0", "checkpoint.every=1",
        "tensorboard=false", "progress=false", *extra])


def test_ppo_runs_saves_its_critic_and_resumes_it(tmp_path, tiny_model_dir):
    run = RLVRRun(_ppo_config(tmp_path, tiny_model_dir))
    assert run.objective.advantage_estimator == "reward"
    record = run.train_step()
    assert "critic/value_loss" in record.metrics and "critic/explained_variance" in record.metrics
    run.step += 1
    path = run.save_checkpoint()
    saved = {k: v.clone() for k, v in run.trainer.loss.critic.model.state_dict().items()}
    run.lock.release()
    resumed = RLVRRun(_ppo_config(tmp_path, tiny_model_dir), resume=True)
    assert resumed.step == 1 and path.exists()
    state = resumed.trainer.loss.critic.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    steps = [float(s["step"]) for s in resumed.trainer.loss.critic.optimizer.state.values()]
    assert steps and all(step == 2.0 for step in steps)  # Adam's state: 2 minibatches trained
    resumed.lock.release()


def test_an_undone_step_puts_the_critic_back_too(tmp_path, tiny_model_dir):
    """The non-finite guard's undo (health.nonfinite_guard snapshot) restores the critic's
    weights and optimiser as well as the policy's: an undone step never happened."""
    run = RLVRRun(_ppo_config(tmp_path, tiny_model_dir))
    critic = run.trainer.loss.critic
    with torch.no_grad():  # values off their returns whatever the rewards: the critic moves
        critic.model.head.bias.fill_(0.5)
    run.train_step()  # Adam's state exists from here on
    before = {k: v.clone() for k, v in critic.model.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in critic.optimizer.state.values()]
    policy = {k: v.clone() for k, v in run.model.state_dict().items()}
    run.undo.save()
    run.train_step()
    assert not all(torch.equal(v, critic.model.state_dict()[k]) for k, v in before.items())
    run.undo.restore()
    assert all(torch.equal(v, critic.model.state_dict()[k]) for k, v in before.items())
    assert all(torch.equal(m, s["exp_avg"]) for m, s in
               zip(moments, critic.optimizer.state.values(), strict=True))
    assert all(torch.equal(v, run.model.state_dict()[k]) for k, v in policy.items())
    run.lock.release()


def test_a_lora_policys_critic_trains_its_own_adapters(tmp_path, tiny_model_dir):
    """With model.lora the critic trains as the policy does: its own copy of the adapters
    and the head, never the frozen base, and never the policy's adapters."""
    pytest.importorskip("peft")
    run = RLVRRun(_ppo_config(tmp_path, tiny_model_dir, "model.lora={r: 4}"))
    critic = run.trainer.loss.critic
    trainable = {n for n, p in critic.model.named_parameters() if p.requires_grad}
    policy = {n for n, p in run.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("head.") for n in trainable)
    assert len(trainable) == len(policy) + 2  # the head's weight and bias
    with torch.no_grad():  # values off their returns whatever the rewards: the critic moves
        critic.model.head.bias.fill_(0.5)
    critic_adapters = {n: p.detach().clone() for n, p in critic.model.named_parameters()
                       if "lora_" in n}
    run.train_step()
    moved = [n for n, p in critic.model.named_parameters()
             if "lora_" in n and not torch.equal(p, critic_adapters[n])]
    assert moved  # the critic's adapters trained, on tensors the policy does not share
    assert not {id(p) for p in critic.model.parameters()} & {id(p) for p in run.model.parameters()}
    run.lock.release()


def test_a_learner_groups_driver_holds_no_critic(tmp_path, tiny_model_dir):
    # the ranks train the critic (tests/test_learner_group.py); a second copy here would be
    # a whole model's memory that never trains
    for processes, holds_one in ((1, True), (2, False)):
        run = RLVRRun(_ppo_config(tmp_path / str(processes), tiny_model_dir,
                                  f"train.learner_processes={processes}"))
        assert (run.trainer.loss.critic is not None) == holds_one
        run.lock.release()


def test_ppo_config_errors_name_what_is_wrong(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="ratio_level"):
        _ppo_config(tmp_path, tiny_model_dir, "loss.ratio_level=sequence")
