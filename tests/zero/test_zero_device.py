"""`device: auto | cpu | cuda` for Zero: the learner, its batches and self-play's network calls
on the configured device, weights published as CPU tensors, models and checkpoints that load
on the CPU whatever device wrote them. The CUDA tests run only where torch sees a GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from rlscale.cli.zero import app
from rlscale.config import ConfigError, load_config
from rlscale.runtime.device import DeviceError
from rlscale.runtime.versions import WeightStore
from rlscale.zero.actors import SelfPlayWorker, WorkerSpec
from rlscale.zero.config import (
    RESUME_FREE_FIELDS,
    MCTSConfig,
    NetworkConfig,
    SelfPlayConfig,
    TrainConfig,
    ZeroConfig,
)
from rlscale.zero.games import make_game
from rlscale.zero.learner import Learner
from rlscale.zero.loop import train
from rlscale.zero.model import load_model
from rlscale.zero.network import PolicyValueNet, load_network, save_network
from rlscale.zero.replay import Samples

torch.set_num_threads(1)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="torch sees no CUDA GPU")
no_cuda = pytest.mark.skipif(CUDA, reason="checks the error of a machine without a GPU")
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "zero"
TTT = make_game("tictactoe")


def _tiny(out: Path, iterations: int, device: str) -> ZeroConfig:
    """Tic-tac-toe in seconds: a tiny net, 8 games of 8 simulations per iteration."""
    return load_config(ZeroConfig, None, [
        f"out={out}", f"device={device}", f"train.iterations={iterations}",
        "network.blocks=1", "network.channels=8", "mcts.simulations=8",
        "selfplay.concurrent_games=8", "selfplay.games_per_iteration=8",
        "train.min_replay=32", "train.batch_size=32", "checkpoint.every=1",
    ])


def _planes(n: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2, (n, *TTT.plane_shape)).astype(np.float32)


def _net() -> PolicyValueNet:
    torch.manual_seed(0)
    return PolicyValueNet(TTT.plane_shape, TTT.num_actions, blocks=1, channels=8, value_hidden=8)


# -- the config, and a missing GPU -----------------------------------------------------------


def test_device_defaults_to_auto_and_may_change_on_resume():
    assert ZeroConfig().device == "auto"
    assert "device" in RESUME_FREE_FIELDS  # speed, not the math
    with pytest.raises(ConfigError, match="device") as err:
        load_config(ZeroConfig, None, ["device=tpu"])
    assert len(str(err.value).splitlines()) == 1


@no_cuda
def test_cuda_without_a_gpu_is_a_one_line_cli_error(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(CONFIGS / "tictactoe.yaml"), "device=cuda",
                                      "--out", str(out), "--no-progress"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: device: cuda"), result.output
    assert "Traceback" not in result.output
    assert not out.exists()  # refused before the run directory is touched


@no_cuda
def test_cuda_without_a_gpu_in_the_arena_cli_and_a_fleet_worker(cli):
    result = cli(["arena", "--game", "connect4", "--games", "2", "--device", "cuda"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "device: cuda" in lines[0], result.output
    spec = WorkerSpec(0, "tictactoe", {}, NetworkConfig(blocks=1, channels=8),
                      MCTSConfig(simulations=4), SelfPlayConfig(concurrent_games=2), 1, 0, 0,
                      device="cuda")
    with pytest.raises(DeviceError, match="device: cuda"):
        SelfPlayWorker(spec)


# -- evaluate(), loading, the weight store ------------------------------------------------------


def test_evaluate_returns_float32_numpy_as_before():
    net = _net().eval()
    planes = _planes()
    priors, values = net.evaluate(planes)
    with torch.inference_mode():  # the CPU path before devices: from_numpy, forward, .numpy()
        logits, v = net(torch.from_numpy(planes))
        expected = torch.softmax(logits, dim=-1).numpy(), v.numpy()
    for got, want in zip((priors, values), expected, strict=True):
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    assert net.device == torch.device("cpu")


def test_load_network_on_a_device_and_the_store_holds_cpu_copies(tmp_path):
    net = _net()
    save_network(net, tmp_path / "m", "tictactoe")
    loaded, _ = load_network(tmp_path / "m", device="cpu")
    assert loaded.device == torch.device("cpu") and not loaded.training
    store = WeightStore(net.state_dict())
    store.publish(net.state_dict(), 1)
    assert store.latest()[0] == 1
    with torch.no_grad():
        net.stem[0].weight.add_(1.0)  # the store keeps what was published, not the live net
    _, state = store.latest()
    assert all(t.device.type == "cpu" for t in state.values())
    assert not torch.equal(state["stem.0.weight"], net.stem[0].weight)


# -- training: cpu and auto on this machine, cuda where there is a GPU ------------------------


def test_cpu_and_auto_train_and_device_may_change_on_resume(tmp_path):
    straight = train(_tiny(tmp_path / "auto", 2, "auto"), progress=False)
    assert straight.counters.iteration == 2 and straight.counters.learner_steps > 0
    # cpu for one iteration, then resumed with auto: no --allow-config-change needed
    train(_tiny(tmp_path / "cpu", 1, "cpu"), progress=False)
    resumed = train(_tiny(tmp_path / "cpu", 2, "auto"), resume=True, progress=False)
    assert resumed.counters.iteration == 2
    a = load_model(straight.final_dir).net.state_dict()
    b = load_model(resumed.final_dir).net.state_dict()
    if not CUDA:  # auto is the CPU here: the same math, so exactly the same weights
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


@needs_cuda
def test_evaluate_and_learner_on_cuda_match_the_cpu():
    net = _net().eval()
    planes = _planes()
    cpu_priors, cpu_values = net.evaluate(planes)
    net.to("cuda")
    priors, values = net.evaluate(planes)
    assert priors.dtype == np.float32 and values.dtype == np.float32
    np.testing.assert_allclose(priors, cpu_priors, atol=1e-4)
    np.testing.assert_allclose(values, cpu_values, atol=1e-4)
    learner = Learner(_net(), TrainConfig(), "cuda")
    batch = Samples(planes, np.full((16, 9), 1 / 9, np.float32), np.ones(16, np.float32),
                    np.zeros(16, np.float32), np.zeros(16, np.int64))
    losses = learner.step(batch)
    assert np.isfinite(losses["value_loss"]) and learner.net.device.type == "cuda"
    state = next(iter(learner.optimizer.state.values()))
    assert state["exp_avg"].device.type == "cuda"


@needs_cuda
def test_a_cuda_run_loads_and_resumes_on_the_cpu(tmp_path):
    result = train(_tiny(tmp_path / "run", 1, "cuda"), progress=False)
    on_cpu = load_model(result.final_dir)  # default: the CPU
    on_gpu = load_model(result.final_dir, device="cuda")
    assert on_cpu.net.device.type == "cpu" and on_gpu.net.device.type == "cuda"
    planes = _planes()
    for got, want in zip(on_cpu.net.evaluate(planes), on_gpu.net.evaluate(planes), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)
    # the checkpoint (optimizer state included) goes on on the CPU
    resumed = train(_tiny(tmp_path / "run", 2, "cpu"), resume=True, progress=False)
    assert resumed.counters.iteration == 2
