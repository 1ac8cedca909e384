"""Part 7: fuzz the config loader and the GTP engine with random keys, values and bytes.

Only one-line errors (ConfigError) or GTP `?` answers may come out: never a traceback, an
internal error or a hang."""

import random
import time

import pytest
import yaml

from rlscale.config import ConfigError, load_config
from rlscale.rlvr.config import RLVRConfig, SFTConfig
from rlscale.zero.config import ZeroConfig
from rlscale.zero.gtp import COMMANDS, random_engine

KEYS = ["run_dir", "model", "model.path", "task", "task.name", "task.options", "train.lr",
        "train.steps", "rollout.group_size", "loss.clip_low", "objective", "eval.every",
        "checkpoint", "health.max_nonfinite_steps", "", ".", "a..b", "train", "x" * 300,
        "network.blocks", "mcts.simulations", "stages", "stages.2", "game.kwargs", "out"]
VALUES = ["1", "-1", "0", "1e400", "nan", ".inf", "-.inf", "[1, 2]", "{a: 1}", "null", "true",
          "'", "\"", "[", "{", "x" * 500, "1e-4", "!!python/object:os.system ls", "&a [*a]",
          "\x00", "\ud7ff", "2**64", str(2**70), "''", "- a\n- b"]


def _random_text(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.3:
        return "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(1, 80)))
    if pick < 0.6:
        return "\n".join(f"{rng.choice(KEYS)}: {rng.choice(VALUES)}"
                         for _ in range(rng.randrange(1, 6)))
    data = {"model": {"path": "m"}, "init_preset": "tiny"}
    for _ in range(rng.randrange(1, 5)):
        data[rng.choice(KEYS)] = yaml.safe_load(rng.choice(VALUES[:10]))
    return yaml.safe_dump(data)


@pytest.mark.parametrize("model", [RLVRConfig, SFTConfig, ZeroConfig])
def test_config_loader_fuzz(tmp_path, model):
    rng = random.Random(f"fuzz:{model.__name__}")
    path = tmp_path / "c.yaml"
    for _ in range(150):
        if rng.random() < 0.2:
            path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
        else:
            path.write_text(_random_text(rng), errors="surrogatepass")
        overrides = [f"{rng.choice(KEYS)}={rng.choice(VALUES)}"
                     for _ in range(rng.randrange(0, 3))]
        if rng.random() < 0.1:
            overrides.append(rng.choice(["novalue", "=1", "a.=2"]))
        try:
            load_config(model, path, overrides)
        except ConfigError as err:
            assert str(err).strip() and len(str(err).splitlines()) >= 1


def test_gtp_engine_fuzz():
    rng = random.Random("gtp")
    engine = random_engine(seed=0)
    words = ["A1", "T19", "j9", "pass", "resign", "black", "white", "b", "w", "0", "-1", "9",
             "19", "25", "1000000", "nan", "inf", "-inf", "1e308", "7.5", "", "\x00", "ü"]
    start = time.perf_counter()
    for _ in range(1500):
        if rng.random() < 0.2:
            line = "".join(chr(rng.randrange(0, 0x500)) for _ in range(rng.randrange(1, 40)))
        else:
            command = rng.choice(sorted(COMMANDS) + ["bogus", "KOMI", "play"])
            line = " ".join([command, *(rng.choice(words) for _ in range(rng.randrange(0, 4)))])
        response = engine.handle(line)
        if response is None:
            continue
        assert response[0] in "=?" and response.endswith("\n\n"), (line, response)
        assert "internal error" not in response, (line, response)
        if engine.finished:
            engine = random_engine(seed=1)
    assert time.perf_counter() - start < 60
