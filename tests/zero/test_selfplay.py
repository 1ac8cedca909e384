"""Self-play, the replay window, checkpoint/resume, the CLI, and tic-tac-toe to perfect play."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from rlscale.cli.zero import app
from rlscale.config import ConfigError, load_config
from rlscale.runtime.rundir import RunDirError
from rlscale.runtime.versions import WeightStore
from rlscale.zero.config import MCTSConfig, SelfPlayConfig, ZeroConfig
from rlscale.zero.games import make_game
from rlscale.zero.games.tictactoe import losses_to_minimax
from rlscale.zero.loop import train
from rlscale.zero.model import load_model
from rlscale.zero.network import PolicyValueNet
from rlscale.zero.replay import ReplayWindow, Samples
from rlscale.zero.selfplay import Actor, PlayStats
from rlscale.zero.training_state import export_training_state

torch.set_num_threads(1)
TTT = make_game("tictactoe")
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "zero"


def _samples(n: int, start: int = 0) -> Samples:
    return Samples(
        np.full((n, 3, 3, 3), 0, np.float32) + np.arange(start, start + n)[:, None, None, None],
        np.full((n, 9), 1 / 9, np.float32),
        np.ones(n, np.float32), np.zeros(n, np.float32), np.arange(start, start + n),
    )


# -- replay ---------------------------------------------------------------------------------


def test_replay_is_a_fifo_window_and_round_trips(tmp_path):
    replay = ReplayWindow(10, (3, 3, 3), 9)
    replay.add(_samples(7))
    replay.add(_samples(7, start=7))
    assert len(replay) == 10 and replay.total_added == 14
    batch = replay.sample(200, np.random.default_rng(0))
    assert set(batch.policy_version.tolist()) == set(range(4, 14))  # the newest 10
    assert (batch.planes[:, 0, 0, 0] == batch.policy_version).all()
    replay.save(tmp_path / "replay.npz")
    again = ReplayWindow(10, (3, 3, 3), 9)
    again.load(tmp_path / "replay.npz")
    assert again.total_added == 14
    for name in ("planes", "policy", "outcome", "policy_version"):
        np.testing.assert_array_equal(getattr(again, name), getattr(replay, name))
    grown = ReplayWindow(10, (3, 3, 3), 9, window_start=4, window_growth=0.5)
    grown.add(_samples(8))
    assert grown.window() == 6  # 4 + 0.5 * (8 - 4)
    assert set(grown.sample(100, np.random.default_rng(0)).policy_version) <= set(range(2, 8))
    # a window refilled after a resume that lost 8 samples grows on from them: once it holds
    # window_start samples it takes all it holds, up to 4 + 0.5 * (8 + 6 - 4) = 9
    refilled = ReplayWindow(10, (3, 3, 3), 9, window_start=4, window_growth=0.5)
    refilled.earlier = 8
    refilled.add(_samples(3))
    assert refilled.refilling() and refilled.window() == 3
    refilled.add(_samples(3, start=3))
    assert not refilled.refilling() and refilled.window() == 6
    refilled.save(tmp_path / "refilled.npz")
    again = ReplayWindow(10, (3, 3, 3), 9, window_start=4, window_growth=0.5)
    again.load(tmp_path / "refilled.npz")
    assert (again.earlier, again.total_added, again.window()) == (8, 6, 6)
    assert not grown.refilling()  # a window that lost nothing never waits


@pytest.mark.parametrize("name", ["tictactoe", "connect4"])
def test_replay_symmetry_augmentation_keeps_policy_consistent(name):
    game = make_game(name)
    rng = np.random.default_rng(0)
    state = game.initial_state()
    for _ in range(3):  # an asymmetric position
        legal = np.flatnonzero(game.legal_mask(state))
        state = game.apply(state, int(legal[rng.integers(legal.size)]))
    legal = game.legal_mask(state)
    # Policy: all mass on the lowest-numbered legal move; plane 0 gets a marker cell that
    # moves with that action, so planes and policy must agree after any symmetry.
    action = int(np.flatnonzero(legal)[0])
    planes = game.planes(state)
    planes[0] = 0.0
    if name == "tictactoe":
        planes[0].flat[action] = 1.0
    else:
        planes[0, 0, action] = 1.0  # top cell of the column
    policy = np.zeros(game.num_actions, np.float32)
    policy[action] = 1.0
    replay = ReplayWindow(4, game.plane_shape, game.num_actions)
    replay.add(Samples(planes[None], policy[None], np.ones(1, np.float32),
                       np.zeros(1, np.float32), np.zeros(1, np.int64)))
    batch = replay.sample(64, rng, game)
    seen = set()
    for p, pi in zip(batch.planes, batch.policy, strict=True):
        assert pi.sum() == pytest.approx(1.0) and pi.max() == 1.0
        where = int(np.argmax(pi))
        marker = np.argwhere(p[0] == 1.0)[0]
        if name == "tictactoe":
            assert where == marker[0] * 3 + marker[1]
        else:
            assert where == marker[1]
        # The stones move with the marker: every variant is a symmetry of the original.
        assert sorted(p[1].ravel()) == sorted(planes[1].ravel())
        seen.add(p.tobytes())
    assert len(seen) == (8 if name == "tictactoe" else 2)


# -- the actor ------------------------------------------------------------------------------


def test_actor_plays_games_and_stamps_versions():
    torch.manual_seed(0)
    net = PolicyValueNet(TTT.plane_shape, 9, 1, 8)
    store = WeightStore(net.state_dict(), version=3)
    actor = Actor(TTT, PolicyValueNet(TTT.plane_shape, 9, 1, 8), MCTSConfig(simulations=16),
                  SelfPlayConfig(concurrent_games=8, games_per_iteration=10), store,
                  np.random.default_rng(0))
    assert actor.sync() == 3
    samples, stats = actor.play(10)
    assert stats.games >= 10 and len(samples) == stats.positions == sum(stats.lengths)
    assert (samples.policy_version == 3).all()
    np.testing.assert_allclose(samples.policy.sum(-1), 1.0, rtol=1e-5)
    assert set(np.unique(samples.outcome)) <= {-1.0, 0.0, 1.0}
    # z is from the view of the player to move: in a decided game it alternates sign.
    marks = samples.planes[:, :2].sum((1, 2, 3))
    first = np.flatnonzero(marks == 0)
    for start, stop in zip(first, list(first[1:]) + [len(samples)], strict=True):
        z = samples.outcome[start:stop]
        assert (z[::2] == z[0]).all() and (z[1::2] == -z[0]).all()
    store.publish(net.state_dict(), 4)
    assert actor.sync() == 4


def test_actor_numbers_its_games_and_hands_over_only_finished_ones():
    net = PolicyValueNet(TTT.plane_shape, 9, 1, 8)
    actor = Actor(TTT, PolicyValueNet(TTT.plane_shape, 9, 1, 8), MCTSConfig(simulations=4),
                  SelfPlayConfig(concurrent_games=6), WeightStore(net.state_dict()),
                  np.random.default_rng(0), first_game=100)
    actor.sync()
    assert actor.in_flight() == list(range(100, 106))
    stats, finished = PlayStats(), []
    for _ in range(12):
        finished += actor.step(stats)
    ids = [g.game for g in finished]
    # every game started is either finished (once) or in flight: nothing lost or doubled
    assert sorted(ids + actor.in_flight()) == list(range(100, actor.next_game))
    assert stats.games == len(finished) > 6 and stats.positions == sum(len(g.samples) for g in finished)
    for game in finished:  # a whole game: its samples are its plies, the last one decided it
        assert len(game.samples) == game.length == len(game.moves)
        assert TTT.is_terminal(functools.reduce(TTT.apply, game.moves, TTT.initial_state()))
    assert actor.state_dict()["next_game"] == actor.next_game


def test_resignation_is_counted_and_checked():
    net = PolicyValueNet(TTT.plane_shape, 9, 1, 8)
    store = WeightStore(net.state_dict())
    cfg = SelfPlayConfig(concurrent_games=16, resign_threshold=0.5, resign_min_moves=0,
                         resign_playout_share=0.5)
    actor = Actor(TTT, PolicyValueNet(TTT.plane_shape, 9, 1, 8), MCTSConfig(simulations=8),
                  cfg, store, np.random.default_rng(0))
    actor.sync()
    _, stats = actor.play(32)
    # With a threshold above any untrained value, everyone who may resign does at once.
    assert stats.resigned > 0 and stats.playout_would_resign > 0
    assert 0 <= stats.false_resignations <= stats.playout_would_resign


def _opening_actor(game, **selfplay):
    torch.manual_seed(0)
    net = PolicyValueNet(game.plane_shape, game.num_actions, 1, 8)
    cfg = SelfPlayConfig(concurrent_games=8, **{"temperature_moves": 0, **selfplay})
    actor = Actor(game, PolicyValueNet(game.plane_shape, game.num_actions, 1, 8),
                  MCTSConfig(simulations=8, gumbel=True, gumbel_considered=9), cfg,
                  WeightStore(net.state_dict()), np.random.default_rng(0))
    actor.sync()
    return actor


def test_random_openings_diversify_games_and_are_not_recorded():
    # Greedy Gumbel search with no sampling: every game is the same line.
    samples, stats = _opening_actor(TTT).play(16)
    assert stats.games >= 16 and len(stats.sequences) == 1
    assert len(samples) == sum(stats.lengths)
    # Every game opens with 1-3 random moves: many lines, and no sample holds the empty
    # board or any opening position (positions before the search took over are not trained on).
    samples, stats = _opening_actor(
        TTT, random_opening_share=1.0, random_opening_plies=3).play(32)
    assert len(stats.sequences) > 8
    stones = samples.planes[:, :2].sum((1, 2, 3))
    assert stones.min() >= 1
    assert len(samples) < sum(stats.lengths)  # opening plies count in the length, not as samples
    # An opening never finishes the game: with up to 9 random plies every game still gets a
    # searched (recorded) move, and every game counts.
    samples, stats = _opening_actor(
        TTT, random_opening_share=1.0, random_opening_plies=9).play(16)
    assert stats.games >= 16 and len(samples) >= stats.games
    assert samples.planes[:, :2].sum((1, 2, 3)).max() <= 8


def test_random_openings_off_leave_self_play_unchanged():
    # share 0 (or 0 plies) draws nothing from the RNG: the same games as without the option.
    # Sampled openings (temperature_moves) make the games depend on the RNG stream.
    plain, stats = _opening_actor(TTT, temperature_moves=4).play(12)
    assert len(stats.sequences) > 1
    off, _ = _opening_actor(TTT, temperature_moves=4, random_opening_share=0.5).play(12)
    np.testing.assert_array_equal(plain.planes, off.planes)
    np.testing.assert_array_equal(plain.policy, off.policy)


# -- the loop: checkpoint / resume, CLI ---------------------------------------------------------


def _tiny_args(out: Path, iterations: int) -> list[str]:
    return [
        f"out={out}", f"train.iterations={iterations}", "network.blocks=1", "network.channels=8",
        "mcts.simulations=8", "selfplay.concurrent_games=8", "selfplay.games_per_iteration=8",
        "train.min_replay=32", "train.batch_size=32", "checkpoint.every=2", "checkpoint.keep=3",
    ]


def _tiny(out: Path, iterations: int) -> ZeroConfig:
    return load_config(ZeroConfig, None, _tiny_args(out, iterations))


def test_checkpoint_and_exact_resume(tmp_path):
    straight = train(_tiny(tmp_path / "a", 4), progress=False)
    train(_tiny(tmp_path / "b", 2), progress=False)
    with pytest.raises(RunDirError, match="already holds a run"):
        train(_tiny(tmp_path / "b", 4), progress=False)
    resumed = train(_tiny(tmp_path / "b", 4), resume=True, progress=False)
    a, b = straight.counters, resumed.counters
    assert (a.iteration, a.games, a.samples, a.learner_steps, a.version) == (
        b.iteration, b.games, b.samples, b.learner_steps, b.version)
    assert a.iteration == 4 and a.learner_steps > 0
    wa = load_model(straight.final_dir).net.state_dict()
    wb = load_model(resumed.final_dir).net.state_dict()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=0)
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert "credit/value_loss" in rows[-1] and "staleness/lag_mean" in rows[-1]
    assert rows[-1]["credit/held_out_value_loss"] >= 0.0
    assert rows[-1]["bias_variance/held_out_policy_loss"] > 0.0
    assert 0.0 < rows[-1]["moving/distinct_games"] <= 1.0
    # the version lag of every sample trained on, as a TensorBoard histogram per iteration
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "a" / "tb"), size_guidance={"histograms": 0})
    events.Reload()
    lags = events.Histograms("staleness/lag")
    assert lags and lags[-1].step == 4
    assert lags[-1].histogram_value.min >= 0
    rows_a = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    steps = rows_a[-1]["counters/learner_steps"] - rows_a[-2]["counters/learner_steps"]
    assert lags[-1].histogram_value.num == steps * 32 > 0  # batch_size=32 in _tiny
    ckpts = sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir())
    assert ckpts == ["step_000002", "step_000004"]
    assert (tmp_path / "b" / "config.yaml").is_file()


def test_stages_change_settings_mid_run_like_a_resume(tmp_path):
    stages = ["stages={4: {train.lr: 0.01, train.sample_reuse: 2.0, replay.capacity: 100,"
              " train.value_target_mix: 0.5}}"]
    straight = train(load_config(ZeroConfig, None, [*_tiny_args(tmp_path / "a", 5), *stages]),
                     progress=False)
    # By hand: stop after iteration 3, resume the same config to 5.
    train(load_config(ZeroConfig, None, [*_tiny_args(tmp_path / "b", 3), *stages]),
          progress=False)
    resumed = train(load_config(ZeroConfig, None, [*_tiny_args(tmp_path / "b", 5), *stages]),
                    resume=True, progress=False)
    wa = load_model(straight.final_dir).net.state_dict()
    wb = load_model(resumed.final_dir).net.state_dict()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=0)
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/lr"] for r in rows] == [2e-3, 2e-3, 2e-3, 0.01, 0.01]
    assert rows[2]["replay/size"] > 100 and rows[4]["replay/size"] == 100
    def added(key: str) -> list[int]:
        return [b[key] - a[key] for a, b in zip(rows, rows[1:], strict=False)]

    # sample_reuse 2 instead of 4: half the learner steps per new sample (whole batches)
    per_sample = [s / n for s, n in zip(added("counters/learner_steps"),
                                        added("counters/samples"), strict=True)]
    assert 0 < per_sample[-1] < 0.75 * per_sample[1]
    assert (tmp_path / "a" / "checkpoints" / "step_000003").is_dir()  # saved at the switch


def test_a_stage_grows_the_network(tmp_path):
    args = [*_tiny_args(tmp_path / "g", 4), "stages={3: {network.blocks: 2, network.value_channels: 2}}"]
    result = train(load_config(ZeroConfig, None, args), progress=False)
    agent = load_model(result.final_dir)
    assert agent.net.arch["blocks"] == 2 and agent.net.arch["value_channels"] == 2
    rows = [json.loads(x) for x in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["counters/learner_steps"] > rows[1]["counters/learner_steps"]
    # the checkpoint before the switch keeps the small net; resuming the grown run works
    small = load_model(tmp_path / "g" / "checkpoints" / "step_000002")
    assert small.net.arch["blocks"] == 1
    more = train(load_config(ZeroConfig, None, [*args[:1], "train.iterations=5", *args[2:]]),
                 resume=True, progress=False)
    assert more.counters.iteration == 5


def test_a_run_starts_from_a_saved_model(tmp_path):
    first = train(_tiny(tmp_path / "first", 2), progress=False)
    # Before any update (min_replay out of reach) the warm-started run holds the saved weights,
    # grown to 2 blocks as by a stage: the same function.
    warm = [*_tiny_args(tmp_path / "warm", 1), f"network.init_from={tmp_path / 'first'}",
            "network.blocks=2", "train.min_replay=100000"]
    result = train(load_config(ZeroConfig, None, warm), progress=False)
    before, after = load_model(first.final_dir), load_model(result.final_dir)
    assert after.net.arch["blocks"] == 2 and result.counters.learner_steps == 0
    planes = np.stack([TTT.planes(s) for s in _states_after(TTT, [[], [4], [4, 0]])])
    for got, want in zip(after.net.evaluate(planes), before.net.evaluate(planes), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    # a resume takes the checkpoint, not the start model (gone by then)
    (tmp_path / "first" / "final" / "model.json").rename(tmp_path / "moved.json")
    more = train(load_config(ZeroConfig, None, [*warm[:1], "train.iterations=2", *warm[2:]]),
                 resume=True, progress=False)
    assert more.counters.iteration == 2
    # a missing or mismatched start model is a one-line error before the run dir is made
    for value, words in [(tmp_path / "nowhere", "network.init_from: no model.json"),
                         (result.final_dir, "network.init_from: ")]:
        args = [*_tiny_args(tmp_path / "bad", 1), f"network.init_from={value}",
                "network.channels=4"]
        with pytest.raises((FileNotFoundError, ValueError)) as err:
            train(load_config(ZeroConfig, None, args), progress=False)
        assert str(err.value).startswith(words) and "\n" not in str(err.value)
    assert not (tmp_path / "bad").exists()


def test_a_run_continues_from_an_exported_training_state(tmp_path):
    """A run's training state without its replay (what is committed beside the code to
    outlive a clone) continues the run in a new directory: counters, optimiser and learner
    steps go on, the replay refills."""
    first = train(_tiny(tmp_path / "first", 2), progress=False)
    state = export_training_state(tmp_path / "first", tmp_path / "state")
    assert sorted(p.name for p in state.iterdir()) == [
        "config.yaml", "model.json", "model.safetensors", "trainer.pt"]
    with pytest.raises(FileExistsError):  # nothing of the user's is replaced
        export_training_state(tmp_path / "first", tmp_path / "state")
    saved = torch.load(state / "trainer.pt", weights_only=False)["learner"]
    more = train(_tiny(tmp_path / "next", 4), progress=False, resume_from=state)
    c, c0 = more.counters, first.counters
    assert c.iteration == 4 and c.version == c0.version + 2
    assert c.games == c0.games + 2 * 8 and c.learner_steps > c0.learner_steps
    steps = [json.loads(line)["step"] for line in
             (tmp_path / "next" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 4]
    # the optimiser went on from the saved moments (AdamW's step count), not afresh
    resumed = torch.load(tmp_path / "next" / "checkpoints" / "step_000004" / "trainer.pt",
                         weights_only=False)["learner"]
    step = lambda s: next(iter(s["optimizer"]["state"].values()))["step"]  # noqa: E731
    assert float(step(resumed)) == float(step(saved)) + c.learner_steps - c0.learner_steps
    # a run directory names its newest checkpoint as well; the math is checked as on --resume
    lr = load_config(ZeroConfig, None, [*_tiny_args(tmp_path / "lr", 3), "train.lr=0.5"])
    with pytest.raises(RunDirError, match="changes the math"):
        train(lr, progress=False, resume_from=tmp_path / "first")
    train(lr, progress=False, resume_from=tmp_path / "first", allow_config_change=True)
    change = json.loads((tmp_path / "lr" / "config_changes.jsonl").read_text())
    assert change["step"] == 3 and change["changes"]["train.lr"]["new"] == 0.5
    for kwargs, words in [({"resume_from": tmp_path / "nowhere"}, "--resume-from: "),
                          ({"resume_from": state, "resume": True}, "--resume continues")]:
        with pytest.raises((FileNotFoundError, ConfigError)) as err:
            train(_tiny(tmp_path / "bad", 4), progress=False, **kwargs)
        assert str(err.value).startswith(words) and "\n" not in str(err.value)
    assert not (tmp_path / "bad").exists()
    runner = CliRunner()
    done = runner.invoke(app, ["export-state", str(tmp_path / "next"), "--out",
                               str(tmp_path / "state2")])
    assert done.exit_code == 0 and (tmp_path / "state2" / "trainer.pt").is_file(), done.output
    refused = runner.invoke(app, ["export-state", str(tmp_path / "nowhere"), "--out",
                                  str(tmp_path / "state3")])
    assert refused.exit_code != 0 and "holds no checkpoint" in refused.output


def test_a_run_resumed_without_its_replay_learns_once_the_refill_holds_window_start(tmp_path):
    """Resumed from a state without its replay, the learner waits until the refilled window
    holds replay.window_start samples (not one iteration's games), and the window grows on
    from the samples the run had added, not from a young run's start."""
    args = lambda out, n: [*_tiny_args(out, n), "replay.window_start=100"]  # noqa: E731
    first = train(load_config(ZeroConfig, None, args(tmp_path / "first", 2)), progress=False)
    assert first.counters.learner_steps > 0  # a fresh run learns from min_replay on
    state = export_training_state(tmp_path / "first", tmp_path / "state")
    more = train(load_config(ZeroConfig, None, args(tmp_path / "next", 5)), progress=False,
                 resume_from=state)
    rows = [json.loads(line) for line in
            (tmp_path / "next" / "metrics.jsonl").read_text().splitlines()]
    waiting = [r for r in rows if r["replay/refilling"] == 1.0]
    assert waiting and all(r["replay/size"] < 100 for r in waiting)
    assert all("credit/value_loss" not in r and r["counters/learner_steps"]
               == first.counters.learner_steps for r in waiting)
    learning = rows[len(waiting):]
    assert learning and all(r["replay/refilling"] == 0.0 and r["replay/size"] >= 100
                            and "credit/value_loss" in r for r in learning)
    # the window takes everything refilled: 100 + 0.5 * (samples - 100) exceeds what it holds
    assert all(r["replay/window"] == r["replay/size"] for r in rows)
    assert more.counters.learner_steps > first.counters.learner_steps
    # the lost count is kept in the refilled run's own checkpoints
    saved = np.load(tmp_path / "next" / "checkpoints" / "step_000004" / "replay.npz")
    assert int(saved["earlier"]) == first.counters.samples


SHIPPED = Path(__file__).resolve().parents[2] / "src" / "rlscale" / "zero" / "models"


@pytest.mark.parametrize("model, config, extra", [
    ("go7", "go7.yaml", ["network.ownership_head=true"]),
    ("go9", "go9_grow.yaml", [])])
def test_a_committed_go_training_state_continues_its_counters(tmp_path, model, config, extra):
    """A Go run's state committed beside the code (models/go7, models/go9: network,
    optimiser, counters; no replay) continues in a fresh clone with its recipe: one more
    iteration, counted on from where the run stopped (a tiny self-play budget, so the config
    change is allowed; go9's network has grown to its last stage's depth)."""
    saved = json.loads((SHIPPED / model / "model.json").read_text())["extra"]["counters"]
    args = [f"out={tmp_path / model}", f"train.iterations={saved['iteration'] + 1}",
            "selfplay.concurrent_games=4", "selfplay.games_per_iteration=4",
            "mcts.simulations=4", "mcts.gumbel_considered=4", "train.min_replay=64",
            "replay.window_start=64", "train.batch_size=32", "train.threads=1", *extra]
    cfg = load_config(ZeroConfig, CONFIGS / config, args)
    with pytest.raises(RunDirError, match="changes the math"):
        train(cfg, progress=False, resume_from=SHIPPED / model)
    c = train(cfg, progress=False, resume_from=SHIPPED / model,
              allow_config_change=True).counters
    assert (c.iteration, c.version) == (saved["iteration"] + 1, saved["version"] + 1)
    # an iteration takes every game that finished by the step that made games_per_iteration
    assert saved["games"] + 4 <= c.games <= saved["games"] + 8
    assert c.learner_steps > saved["learner_steps"]


def _states_after(game, move_lists):
    states = []
    for moves in move_lists:
        state = game.initial_state()
        for move in moves:
            state = game.apply(state, move)
        states.append(state)
    return states


def test_stage_config_errors():
    base = ["train.iterations=10"]
    cfg = load_config(ZeroConfig, None, [*base, "stages={3: {train.lr: 0.1}, 6: {mcts.c_puct: 2}}"])
    assert cfg.at_iteration(2).train.lr == cfg.train.lr and cfg.at_iteration(3).train.lr == 0.1
    assert cfg.at_iteration(7).train.lr == 0.1 and cfg.at_iteration(7).mcts.c_puct == 2
    assert cfg.stage_start(1) == 1 and cfg.stage_start(5) == 3 and cfg.stage_start(9) == 6
    for stage, words in [("{3: {train.lrr: 0.1}}", "stages.3: train.lrr"),
                         ("{3: {network.channels: 9}}", "stages.3.network.channels: cannot"),
                         ("{3: {network.blocks: 0}}", "stages.3.network.blocks: a network can "
                                                      "only grow"),
                         ("{3: {train.iterations: 9}}", "cannot change"),
                         ("{1: {train.lr: 0.1}}", "iteration 2 or later"),
                         ("{3: {train.lr.x: 0.1}}", "stages.3"),
                         ("{3: {train.lr: fast}}", "stages.3: train.lr")]:
        with pytest.raises(ConfigError) as err:
            load_config(ZeroConfig, None, [*base, f"stages={stage}"])
        assert words in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


def test_cli_train_and_config_errors(tmp_path):
    runner = CliRunner()
    args = ["train", str(CONFIGS / "tictactoe.yaml"), "train.iterations=1", "mcts.simulations=4",
            "selfplay.concurrent_games=4", "selfplay.games_per_iteration=4", "network.blocks=1",
            "play_mcts.c_puct=3.0", "--out", str(tmp_path / "run"), "--no-progress"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "final" / "model.json").is_file()
    agent = load_model(tmp_path / "run")  # the play settings are saved with the model
    assert agent.mcts.c_puct == 3.0 and agent.mcts.simulations == 4
    assert load_model(tmp_path / "run", c_puct=1.0).mcts.c_puct == 1.0  # overrides win
    bad = runner.invoke(app, ["train", str(CONFIGS / "tictactoe.yaml"), "mcts.simulationz=4"])
    assert bad.exit_code == 2 and "mcts.simulationz" in bad.output
    bad = runner.invoke(app, ["train", str(CONFIGS / "tictactoe.yaml"), "play_mcts.cpuct=4"])
    assert bad.exit_code == 2 and "cpuct" in bad.output and len(bad.output.splitlines()) == 1


# -- the headline: tic-tac-toe to perfect play --------------------------------------------------


@pytest.mark.slow
def test_tictactoe_training_reaches_perfect_play(tmp_path):
    result = CliRunner().invoke(app, [
        "train", str(CONFIGS / "tictactoe.yaml"), "--out", str(tmp_path / "ttt"), "--no-progress",
    ])
    assert result.exit_code == 0, result.output
    agent = load_model(tmp_path / "ttt")
    assert agent.mcts.simulations == 32 and agent.mcts.dirichlet_fraction == 0.25  # defaults
    for simulations in (32, 64):
        cache: dict = {}

        def choose(state, simulations=simulations, cache=cache):
            if state not in cache:
                cache[state] = agent.choose(state, simulations)
            return cache[state]

        for player in (0, 1):
            lost, games = losses_to_minimax(choose, player)
            assert games > 1 and lost == 0, f"lost {lost}/{games} as player {player} at {simulations}"
    rows = [json.loads(x) for x in (tmp_path / "ttt" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["credit/outcome_draw"] > 0.5  # self-play has converged to draws


def test_shipped_connect4_model_loads_and_plays():
    shipped = Path(__file__).resolve().parents[2] / "src/rlscale/zero/models/connect4"
    if not (shipped / "model.json").is_file():
        pytest.skip("no shipped Connect Four model")
    agent = load_model(shipped)
    assert agent.game.name == "connect4" and agent.mcts.simulations >= 1
    c4 = agent.game
    state = c4.initial_state()
    for a in (0, 0, 1, 1, 2, 2):  # player 0 to move wins in column 4
        state = c4.apply(state, a)
    assert agent.choose(state, simulations=64) == 3
    assert c4.legal_mask(state)[agent.choose(state, simulations=0)]
    assert sum(f.stat().st_size for f in shipped.iterdir()) < 4_000_000
