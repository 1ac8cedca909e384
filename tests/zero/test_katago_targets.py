"""KataGo's sample-efficiency switches for Go: the ownership and score targets (recorded at
the end of played-out games, moved by the board symmetries, masked in resigned games), their
heads and losses, and global pooling; every switch off is the network of before."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlscale.config import ConfigError, load_config
from rlscale.runtime.versions import WeightStore
from rlscale.zero.config import MCTSConfig, NetworkConfig, SelfPlayConfig, TrainConfig, ZeroConfig
from rlscale.zero.games.go import Go
from rlscale.zero.learner import Learner, ownership_loss, score_loss
from rlscale.zero.loop import train
from rlscale.zero.network import (
    PolicyValueNet,
    grow_network,
    load_network,
    network_for,
    save_network,
)
from rlscale.zero.replay import ReplayWindow, Samples
from rlscale.zero.selfplay import Actor, PlayStats

GO7 = Go(7, komi=9, history=1)
GO5 = Go(5, komi=0.5, history=1)
HEADS = NetworkConfig(blocks=1, channels=16, value_hidden=16, ownership_head=True,
                      score_head=True)


def test_ownership_of_a_finished_7x7_position():
    # Black's wall in column C, White's in E; the D column between them is dame. White's dead
    # stone at A1 stays on the board (Tromp-Taylor removes nothing), so Black's A-B region
    # reaches both colours: nobody's.
    state = GO7.from_diagram("""
        . . X . O . .
        . . X . O . .
        . . X . O . .
        . . X . O . .
        . . X . O . .
        . . X . O . .
        O . X . O . .
    """)
    want = np.zeros((7, 7), np.int8)
    want[:, 2] = 1
    want[:, 4:] = -1
    want[6, 0] = -1
    np.testing.assert_array_equal(GO7.ownership(state), want)
    assert GO7.area(state) == (7, 22)  # area is the count of each owner's points
    assert GO7.score(state) == 7 - 22 - 9


def _actor(net: PolicyValueNet, **selfplay) -> Actor:
    config = SelfPlayConfig(concurrent_games=8, games_per_iteration=8, **selfplay)
    return Actor(GO5, net, MCTSConfig(simulations=4), config, WeightStore(),
                 np.random.default_rng(0))


def test_samples_carry_the_final_position_from_the_view_of_the_player_to_move():
    torch.manual_seed(0)
    # Resign at once below 0.99 (nearly always), except in half the games, played out.
    actor = _actor(network_for(GO5, HEADS), resign_threshold=0.99, resign_min_moves=2,
                   resign_playout_share=0.5)
    stats, games = PlayStats(), []
    while len({g.resigned for g in games if len(g.samples)}) < 2:
        games += actor.step(stats)
    for game in games:
        s = game.samples
        if not len(s):
            continue
        if game.resigned:  # no final position: unknown, and zeros
            assert not s.final_known.any() and not s.ownership.any() and not s.score.any()
            continue
        final = GO5.initial_state()
        for move in game.moves:
            final = GO5.apply(final, move)
        assert GO5.is_terminal(final) and s.final_known.all()
        black_to_move = s.planes[:, -2, 0, 0] == 1
        for i, black in enumerate(black_to_move):
            sign = 1 if black else -1
            np.testing.assert_array_equal(s.ownership[i], sign * GO5.ownership(final))
            assert s.score[i] == sign * GO5.score(final)
    # a network without the heads records nothing more than before
    plain = _actor(network_for(GO5, NetworkConfig(blocks=1, channels=8)))
    samples, _ = plain.play(2)
    assert samples.ownership is None and samples.fields() == Samples.empty((1,), 1).fields()


def _samples_with_ownership(n: int, seed: int) -> Samples:
    """Random Go positions whose ownership target is own stones minus opponent stones, so a
    transformed sample must keep ownership == planes[0] - planes[1]."""
    rng = np.random.default_rng(seed)
    stones = rng.integers(0, 3, (n, 7, 7))
    planes = np.zeros((n, *GO7.plane_shape), np.float32)
    planes[:, 0], planes[:, 1], planes[:, -1] = stones == 1, stones == 2, 1.0
    ownership = (planes[:, 0] - planes[:, 1]).astype(np.int8)
    policy = rng.dirichlet(np.ones(GO7.num_actions), n).astype(np.float32)
    return Samples(planes, policy, rng.choice([-1.0, 1.0], n).astype(np.float32),
                   np.zeros(n, np.float32), np.zeros(n, np.int64), ownership,
                   rng.normal(size=n).astype(np.float32), rng.random(n) < 0.5)


def test_symmetries_move_the_ownership_plane_with_the_board(tmp_path):
    samples = _samples_with_ownership(64, seed=1)
    with_targets = ReplayWindow(100, GO7.plane_shape, GO7.num_actions, final_targets=True)
    without = ReplayWindow(100, GO7.plane_shape, GO7.num_actions)
    with_targets.add(samples)
    without.add(samples)
    batch = with_targets.sample(256, np.random.default_rng(2), GO7)
    np.testing.assert_array_equal(batch.ownership, batch.planes[:, 0] - batch.planes[:, 1])
    # ... and really transformed: most sampled planes are not stored ones
    stored = {p.tobytes() for p in samples.planes}
    assert sum(p.tobytes() not in stored for p in batch.planes) > 128
    # The RNG stream and the other fields are those of a window without the targets.
    plain = without.sample(256, np.random.default_rng(2), GO7)
    assert plain.ownership is None
    for field in ("planes", "policy", "outcome", "root_value", "policy_version"):
        np.testing.assert_array_equal(getattr(batch, field), getattr(plain, field))
    # saved and loaded: the same window
    with_targets.save(tmp_path / "replay.npz")
    again = ReplayWindow(100, GO7.plane_shape, GO7.num_actions, final_targets=True)
    again.load(tmp_path / "replay.npz")
    for field in samples.fields():
        np.testing.assert_array_equal(getattr(again, field), getattr(with_targets, field))


def test_score_and_known_flag_travel_with_their_sample():
    samples = _samples_with_ownership(32, seed=3)
    window = ReplayWindow(100, GO7.plane_shape, GO7.num_actions, final_targets=True)
    window.add(samples)
    batch = window.sample(64, np.random.default_rng(0), GO7)
    by_outcome_and_score = {(o, s): k for o, s, k in zip(samples.outcome, samples.score,
                                                          samples.final_known, strict=True)}
    for o, s, k in zip(batch.outcome, batch.score, batch.final_known, strict=True):
        assert by_outcome_and_score[(o, s)] == k


def test_the_final_position_losses_mask_resigned_games():
    torch.manual_seed(0)
    logits = torch.randn(6, 5, 5, requires_grad=True)
    target = torch.randint(-1, 2, (6, 5, 5)).float()
    known = torch.tensor([True, False, True, False, True, True])
    loss = ownership_loss(logits, target, known)
    loss.backward()
    assert (logits.grad[~known] == 0).all() and (logits.grad[known] != 0).any()
    # the masked rows' targets do not matter; the mean is over the known rows
    other = target.clone()
    other[~known] = -other[~known]
    torch.testing.assert_close(ownership_loss(logits, other, known), loss)
    torch.testing.assert_close(loss, ownership_loss(logits[known], target[known],
                                                    known[known]))
    nobody = torch.zeros(6, dtype=torch.bool)
    assert float(ownership_loss(logits.detach(), target, nobody)) == 0.0
    # a confident right answer costs (almost) nothing; the score loss masks the same way
    sure = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    assert float(ownership_loss(10 * sure, sure, torch.tensor([True, True]))) < 1e-8
    pred, score = torch.tensor([0.5, 9.0]), torch.tensor([0.0, 0.0])
    assert float(score_loss(pred, score, torch.tensor([True, False]))) == 0.25
    # The learner: a batch of resigned games only has no final-position loss at all.
    learner = Learner(network_for(GO7, HEADS), TrainConfig())
    batch = _samples_with_ownership(16, seed=4)
    resigned = Samples(**{**{f: getattr(batch, f) for f in batch.fields()},
                          "final_known": np.zeros(16, bool)})
    assert "ownership_loss" not in learner.step(resigned)
    losses = learner.step(batch)
    assert losses["ownership_loss"] > 0 and losses["score_loss"] > 0


def test_the_ownership_and_score_heads_learn_on_5x5_go():
    torch.manual_seed(0)
    net = network_for(GO5, HEADS.model_copy(update={"channels": 32}))
    samples, _ = _actor(net, resign_threshold=None).play(24)
    assert samples.final_known.all() and len(samples) > 300
    window = ReplayWindow(10_000, GO5.plane_shape, GO5.num_actions, final_targets=True)
    window.add(samples)
    learner = Learner(net, TrainConfig(lr=3e-3))
    rng = np.random.default_rng(0)

    def measured() -> tuple[float, float]:  # both losses over all the games' positions
        learner.net.eval()
        with torch.no_grad():
            out = learner.net.outputs(torch.from_numpy(samples.planes))
        known = torch.from_numpy(samples.final_known)
        own = ownership_loss(out.ownership_logits,
                             torch.from_numpy(samples.ownership.astype(np.float32)), known)
        score = score_loss(out.score, torch.from_numpy(samples.score / GO5.size ** 2), known)
        return float(own), float(score)

    (own0, score0) = measured()
    for _ in range(100):
        learner.step(window.sample(64, rng, GO5))
    own1, score1 = measured()
    assert own0 > 0.65  # about log 2 per point, untrained
    assert own1 < own0 - 0.1, (own0, own1)  # measured: 0.70 -> 0.51
    assert score1 < 0.7 * score0, (score0, score1)


@pytest.mark.parametrize("overrides, message", [
    (["game.name=connect4", "network.ownership_head=true"],
     "network.ownership_head: game 'connect4' has no final ownership"),
    (["network.score_head=true"], "network.score_head: game 'tictactoe'"),
    (["game.name=openspiel:go", "network.ownership_head=true"], "only go has"),
    (["network.global_pooling=true", "network.blocks=1"],
     "network.global_pooling needs blocks >= 2"),
    (["network.global_pooling=true", "network.channels=2"], "channels >= 4"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(ZeroConfig, None, overrides)
    assert "\n" not in str(err.value)


def test_go_accepts_the_switches():
    cfg = load_config(ZeroConfig, None, [
        "game.name=go", "game.kwargs={size: 5}", "network.ownership_head=true",
        "network.score_head=true", "network.global_pooling=true", "train.ownership_weight=1.0"])
    assert cfg.network.ownership_head and cfg.train.ownership_weight == 1.0
    defaults = ZeroConfig()
    assert not (defaults.network.ownership_head or defaults.network.score_head
                or defaults.network.global_pooling)


def test_switches_off_are_the_network_of_before(tmp_path):
    # Figures of the go7 recipe's network (6 x 64, 2 value planes), seed 0, recorded with
    # the code before the switches existed.
    torch.manual_seed(0)
    net = network_for(GO7, NetworkConfig(blocks=6, channels=64, value_hidden=64,
                                         value_channels=2))
    assert net.num_parameters() == 459103 and len(net.state_dict()) == 96
    assert net.arch == {"blocks": 6, "channels": 64, "value_hidden": 64, "value_channels": 2}
    assert not net.learns_final_position
    total = sum(float(p.detach().double().sum()) for p in net.parameters())
    assert total == pytest.approx(860.2740418396727, abs=1e-9)
    x = torch.from_numpy(np.random.default_rng(0).integers(
        0, 2, (4, *GO7.plane_shape)).astype(np.float32))
    net.eval()
    with torch.no_grad():
        logits, value = net(x)
        out = net.outputs(x)
    torch.testing.assert_close(logits[0, :3], torch.tensor(
        [-0.06029738485813141, 0.056252140551805496, -0.022165611386299133]))
    torch.testing.assert_close(value, torch.tensor(
        [-0.05716007202863693, -0.05259212106466293, -0.05915752425789833,
         -0.0477110929787159]))
    assert torch.equal(out.logits, logits) and torch.equal(out.value, value)
    assert out.ownership_logits is None and out.score is None
    # model.json: no new keys when off
    save_network(net, tmp_path / "m", "go", {"size": 7, "komi": 9, "history": 1})
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert not {"global_pooling", "ownership_head", "score_head"} & meta.keys()


def test_the_options_change_the_network_and_round_trip(tmp_path):
    plain_cfg = NetworkConfig(blocks=3, channels=16, value_hidden=16)
    plain = network_for(GO7, plain_cfg)
    full = network_for(GO7, plain_cfg.model_copy(update={
        "global_pooling": True, "ownership_head": True, "score_head": True}))
    assert full.learns_final_position
    assert [type(b).__name__ for b in full.tower] == [
        "ResidualBlock", "GlobalPoolingBlock", "ResidualBlock"]
    assert full.num_parameters() != plain.num_parameters()
    x = torch.rand(5, *GO7.plane_shape)
    full.eval()
    out = full.outputs(x)
    assert out.ownership_logits.shape == (5, 7, 7) and out.score.shape == (5,)
    assert out.logits.shape == (5, GO7.num_actions) and out.value.abs().max() <= 1
    kwargs = {"size": 7, "komi": 9, "history": 1}
    save_network(full, tmp_path / "full", "go", kwargs)
    loaded, meta = load_network(tmp_path / "full", "go", kwargs)
    assert loaded.arch == full.arch and meta.global_pooling and meta.score_head
    again = loaded.outputs(x)
    for a, b in zip((out.logits, out.value, out.ownership_logits, out.score),
                    (again.logits, again.value, again.ownership_logits, again.score),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # A model without heads (as every model saved before them) loads as it was, and can
    # start a network with heads: policy and value unchanged, fresh heads.
    save_network(plain, tmp_path / "plain", "go", kwargs)
    old, _ = load_network(tmp_path / "plain", "go", kwargs)
    assert old.arch == plain.arch
    headed = grow_network(old, 3, 1, ownership_head=True, score_head=True).eval()
    old.eval()
    assert headed.learns_final_position
    for a, b in zip(old(x), headed(x), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # global pooling blocks grow as identities too
    grown = grow_network(full, 6, 2).eval()
    assert type(grown.tower[4]).__name__ == "GlobalPoolingBlock"
    for a, b in zip(full(x), grown(x), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_a_go_run_with_the_heads_logs_their_losses_and_resumes_exactly(tmp_path):
    def args(out, iterations):
        return [f"out={out}", f"train.iterations={iterations}", "game.name=go",
                "game.kwargs={size: 5, komi: 0.5, history: 1}", "network.blocks=2",
                "network.channels=8", "network.value_hidden=8", "network.ownership_head=true",
                "network.score_head=true", "network.global_pooling=true",
                "mcts.simulations=4", "selfplay.concurrent_games=8",
                "selfplay.games_per_iteration=8", "train.min_replay=32", "train.batch_size=32",
                "train.sample_reuse=1", "checkpoint.every=1"]

    straight = train(load_config(ZeroConfig, None, args(tmp_path / "a", 3)), progress=False)
    train(load_config(ZeroConfig, None, args(tmp_path / "b", 2)), progress=False)
    resumed = train(load_config(ZeroConfig, None, args(tmp_path / "b", 3)), resume=True,
                    progress=False)
    wa, _ = load_network(straight.final_dir)
    wb, _ = load_network(resumed.final_dir)
    for key, value in wa.state_dict().items():
        torch.testing.assert_close(value, wb.state_dict()[key], rtol=0, atol=0)
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss/ownership"] > 0 and rows[-1]["loss/score"] > 0
    assert wa.learns_final_position and "global_pooling" in wa.arch
