"""The policy-value network, its on-disk format, and the learner's loss."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlscale.zero.config import TrainConfig
from rlscale.zero.games import make_game
from rlscale.zero.learner import Learner, zero_losses
from rlscale.zero.network import PolicyValueNet, grow_network, load_network, save_network
from rlscale.zero.replay import Samples

torch.set_num_threads(1)


def test_forward_and_evaluate_shapes():
    net = PolicyValueNet((3, 6, 7), 7, blocks=2, channels=16)
    logits, values = net(torch.rand(5, 3, 6, 7))
    assert logits.shape == (5, 7) and values.shape == (5,)
    priors, values = net.evaluate(np.random.rand(4, 3, 6, 7).astype(np.float32))
    assert priors.dtype == np.float32 and priors.shape == (4, 7)
    np.testing.assert_allclose(priors.sum(-1), 1.0, rtol=1e-5)
    assert values.shape == (4,) and np.all(np.abs(values) <= 1.0)
    assert net.training  # evaluate() restores the training flag it found


def test_save_and_load_round_trip(tmp_path):
    net = PolicyValueNet((3, 3, 3), 9, blocks=1, channels=8, value_hidden=8)
    with torch.no_grad():  # make BatchNorm statistics non-trivial so they must be saved
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    save_network(net, tmp_path / "m", "tictactoe", {}, extra={"mcts": {"simulations": 7}})
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert meta["game"] == "tictactoe" and meta["blocks"] == 1 and meta["channels"] == 8
    loaded, meta = load_network(tmp_path / "m", "tictactoe")
    assert meta.extra["mcts"]["simulations"] == 7
    x = np.random.rand(3, 3, 3, 3).astype(np.float32)
    for a, b in zip(net.evaluate(x), loaded.evaluate(x), strict=True):
        np.testing.assert_array_equal(a, b)


def test_loading_for_another_game_or_size_names_both(tmp_path):
    net = PolicyValueNet((3, 9, 9), 82, blocks=1, channels=8)
    save_network(net, tmp_path / "go9", "go", {"size": 9})
    with pytest.raises(ValueError) as err:
        load_network(tmp_path / "go9", "go", {"size": 19})
    message = str(err.value)
    assert "go(size=9)" in message and "go(size=19)" in message and "\n" not in message
    with pytest.raises(ValueError, match="connect4"):
        load_network(tmp_path / "go9", "connect4")
    with pytest.raises(FileNotFoundError):
        load_network(tmp_path / "nothing-here")


def test_losses_and_learner_fit_a_fixed_batch():
    game = make_game("tictactoe")
    rng = np.random.default_rng(0)
    n = 64
    planes = rng.integers(0, 2, (n, *game.plane_shape)).astype(np.float32)
    policy = rng.dirichlet(np.ones(9), n).astype(np.float32)
    outcome = rng.choice([-1.0, 0.0, 1.0], n).astype(np.float32)
    batch = Samples(planes, policy, outcome, np.zeros(n, np.float32), np.zeros(n, np.int64))
    # The cross-entropy to the target is minimised (= its entropy) by logits = log target.
    logits = torch.log(torch.from_numpy(policy))
    losses = zero_losses(logits, torch.from_numpy(outcome), torch.from_numpy(policy),
                         torch.from_numpy(outcome))
    entropy = -(policy * np.log(policy)).sum(-1).mean()
    assert losses["value_loss"].item() == pytest.approx(0.0)
    assert losses["policy_loss"].item() == pytest.approx(entropy, rel=1e-5)
    torch.manual_seed(0)
    learner = Learner(PolicyValueNet(game.plane_shape, 9, 1, 16),
                      TrainConfig(lr=3e-3, optimizer="adamw"))
    first = learner.step(batch)
    for _ in range(150):
        last = learner.step(batch)
    assert last["value_loss"] < 0.3 * first["value_loss"]
    assert last["policy_loss"] < first["policy_loss"]
    assert learner.steps == 151
    # Held-out losses: exact MSE / cross-entropy in eval mode, and a memorised batch scores far
    # better than fresh positions with fresh outcomes (the overfitting the metric is for).
    seen = learner.held_out(batch)
    learner.net.eval()
    with torch.no_grad():
        logits, values = learner.net(torch.from_numpy(planes))
    learner.net.train()
    assert seen["value_loss"] == pytest.approx(float(((values.numpy() - outcome) ** 2).mean()),
                                               rel=1e-5)
    ce = -(policy * torch.log_softmax(logits, -1).numpy()).sum(-1).mean()
    assert seen["policy_loss"] == pytest.approx(float(ce), rel=1e-5)
    assert learner.net.training  # restored
    fresh_planes = rng.integers(0, 2, (n, *game.plane_shape)).astype(np.float32)
    fresh = Samples(fresh_planes, policy, rng.choice([-1.0, 0.0, 1.0], n).astype(np.float32),
                    np.zeros(n, np.float32), np.zeros(n, np.int64))
    assert learner.held_out(fresh)["value_loss"] > 2 * seen["value_loss"]
    assert learner.held_out(Samples(*(x[:0] for x in (planes, policy, outcome,
                                                       outcome, np.zeros(n, np.int64))))) == {}
    sgd = Learner(PolicyValueNet(game.plane_shape, 9, 1, 16),
                  TrainConfig(optimizer="sgd", lr=0.05, weight_decay=1e-4))
    assert isinstance(sgd.optimizer, torch.optim.SGD)
    assert sgd.optimizer.param_groups[0]["weight_decay"] == 1e-4


def test_resumed_learner_takes_its_learning_rate_from_the_config():
    net = PolicyValueNet((3, 3, 3), 9, 1, 8)
    state = Learner(net, TrainConfig(lr=1e-3)).state_dict()
    resumed = Learner(net, TrainConfig(lr=5e-4))
    resumed.load_state_dict(state)
    assert resumed.optimizer.param_groups[0]["lr"] == 5e-4


def test_learning_rate_step_schedule():
    learner = Learner(PolicyValueNet((3, 3, 3), 9, 1, 8),
                      TrainConfig(lr=1e-3, lr_steps={10: 5e-4, 20: 1e-4}))
    assert [learner.lr_at(i) for i in (1, 9, 10, 19, 20, 99)] == [
        1e-3, 1e-3, 5e-4, 5e-4, 1e-4, 1e-4]


def test_grow_network_keeps_the_function_and_trains_the_new_parts(tmp_path):
    torch.manual_seed(0)
    net = PolicyValueNet((3, 6, 7), 7, blocks=2, channels=16, value_hidden=8)
    # non-trivial BatchNorm statistics, as in a trained net
    net.train()
    for _ in range(3):
        net(torch.rand(32, 3, 6, 7))
    grown = grow_network(net, blocks=4, value_channels=3)
    assert grown.arch == {"blocks": 4, "channels": 16, "value_hidden": 8, "value_channels": 3}
    net.eval()
    grown.eval()
    x = torch.rand(16, 3, 6, 7).round()
    with torch.no_grad():
        (la, va), (lb, vb) = net(x), grown(x)
    torch.testing.assert_close(la, lb, rtol=0, atol=1e-6)
    torch.testing.assert_close(va, vb, rtol=0, atol=1e-6)
    # the zero-initialised parts get gradients, so they learn
    grown.train()
    logits, values = grown(x)
    (values.sum() + logits.logsumexp(-1).sum()).backward()
    assert grown.tower[3].bn2.weight.grad.abs().sum() > 0
    assert grown.value_head[4].weight.grad[:, 42:].abs().sum() > 0
    # saved and loaded with its new shape
    save_network(grown, tmp_path / "m", "connect4")
    loaded, meta = load_network(tmp_path / "m")
    assert meta.blocks == 4 and meta.value_channels == 3 and loaded.arch == grown.arch
    with pytest.raises(ValueError, match="can only grow"):
        grow_network(grown, blocks=2, value_channels=3)
