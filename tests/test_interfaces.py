"""The command line's interfaces (issue 56, item 5): defaults read from what the user gave
(a Go model's board, a task's budget, a run directory's model and config), greedy
evaluation, one-line messages that say what happened, readable help, `--version`, and a
fast `experiments list`."""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlscale.cli import app

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_GO7 = ROOT / "src" / "rlscale" / "zero" / "models" / "go7"


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def one_line_error(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ------------------------------------------------------------------ 1. zero gtp: the model's board


def test_gtp_takes_the_board_size_and_komi_from_the_model():
    from rlscale.cli.play import gtp_engine

    engine = gtp_engine(SHIPPED_GO7, 1, None, None, seed=0)
    assert (engine.game.size, engine.game.komi) == (7, 9.0)  # the model's game kwargs
    # komi is a rule of the game played: another one is allowed
    assert gtp_engine(SHIPPED_GO7, 1, None, 6.5, seed=0).game.komi == 6.5
    with pytest.raises(ValueError, match=r"7x7 go board, not 9x9 \(leave out --size"):
        gtp_engine(SHIPPED_GO7, 1, 9, None, seed=0)
    fresh = gtp_engine(None, 1, None, None, seed=0)  # no model: 9x9, komi 7.5
    assert (fresh.game.size, fresh.game.komi) == (9, 7.5)

    result = CliRunner().invoke(app, ["zero", "gtp", "--model", str(SHIPPED_GO7),
                                      "--simulations", "1"], input="showboard\nquit\n")
    assert result.exit_code == 0, result.output
    assert "   A B C D E F G\n" in result.stdout and " 7 . . . . . . .  7" in result.stdout
    error = one_line_error(CliRunner().invoke(app, ["zero", "gtp", "--model", str(SHIPPED_GO7),
                                                    "--size", "9"], input="quit\n"))
    assert "7x7" in error and "9x9" in error


# ------------------------------------------------------- 2. rlvr eval: greedy, run dirs, budgets


def test_temperature_zero_is_greedy_with_one_sample():
    from rlscale.rlvr.evaluate import check_eval_arguments

    good = dict(prompts=1, ks=(1,), max_new_tokens=8, top_p=1.0)
    check_eval_arguments(samples=1, temperature=0.0, **good)
    with pytest.raises(ValueError, match="greedily"):
        check_eval_arguments(samples=4, temperature=0.0, **good)
    with pytest.raises(ValueError, match="0 \\(greedy\\) or a positive"):
        check_eval_arguments(samples=1, temperature=-1.0, **good)


def test_a_task_names_its_own_completion_budget():
    from rlscale.rlvr.evaluate import DEFAULT_MAX_NEW_TOKENS, task_max_new_tokens
    from rlscale.rlvr.tasks import make_task

    budgets = {name: task_max_new_tokens(make_task(name))
               for name in ("arithmetic", "countdown", "long_arithmetic")}
    assert budgets == {"arithmetic": 8, "countdown": 16, "long_arithmetic": 256}
    reasoning = yaml.safe_load((ROOT / "configs/rlvr/reasoning.yaml").read_text())
    assert reasoning["task"]["name"] == "long_arithmetic"
    assert budgets["long_arithmetic"] == reasoning["rollout"]["max_new_tokens"]  # the recipe's
    assert task_max_new_tokens(object()) == DEFAULT_MAX_NEW_TOKENS


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A `rlvr train` run directory stopped before final/: config.yaml and two checkpoints
    (tiny models), the newer one the model to evaluate."""
    from rlscale.rlvr.model import init_model

    run = tmp_path_factory.mktemp("eval") / "run"
    for step in (1, 2):
        init_model("tiny", run / "checkpoints" / f"step_{step:06d}", seed=step)
    (run / "config.yaml").write_text(yaml.safe_dump({
        "run_dir": str(run), "model": {"path": "somewhere/base"},
        "task": {"name": "long_arithmetic"}, "rollout": {"max_new_tokens": 5}}))
    return run


def test_eval_takes_a_run_directory_and_decodes_greedily(run_dir, monkeypatch):
    import rlscale.rlvr.evaluate as evaluate_module

    calls = []
    real_evaluate = evaluate_module.evaluate

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return real_evaluate(*args, **{**kwargs, "prompts": 2, "max_new_tokens": 3})

    monkeypatch.setattr(evaluate_module, "evaluate", recording)
    newest = run_dir / "checkpoints" / "step_000002"
    runner = CliRunner()
    # the run alone: its newest checkpoint, its config's task and budget
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(run_dir), "--temperature", "0",
                                 "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stderr.strip() == f"model: {newest}"
    assert json.loads(result.stdout)["samples"] == 1
    assert calls[-1]["temperature"] == 0.0 and calls[-1]["max_new_tokens"] == 5
    assert calls[-1]["samples"] == 1
    # a task by name: its own budget, not 8 for every task
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(run_dir), "--task",
                                 "long_arithmetic", "--temperature", "0"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert calls[-1]["max_new_tokens"] == 256
    error = one_line_error(runner.invoke(app, ["rlvr", "eval", "--model", str(run_dir),
                                               "--temperature", "0", "--k", "1,4"]))
    assert "greedily" in error


def test_a_run_directory_without_a_model_is_one_line(tmp_path):
    from rlscale.rlvr.evaluate import find_eval_model

    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("run_dir: run\n")
    error = one_line_error(CliRunner().invoke(app, ["rlvr", "eval", "--model",
                                                    str(tmp_path / "run"), "--task", "arithmetic"]))
    assert "holds no model" in error
    sft_run = tmp_path / "sft"
    (sft_run / "checkpoints").mkdir(parents=True)
    (sft_run / "config.yaml").write_text("out: runs/sft/model\n")
    with pytest.raises(ValueError, match="`rlscale sft` run directory: its model is runs/sft"):
        find_eval_model(sft_run)


# ------------------------------------------------------------------------ 3. the dtype sentence


def test_the_dtype_line_says_what_auto_picked_and_why():
    from rlscale.runtime.device import ComputeDtype, PrecisionProbe

    near = PrecisionProbe(float32_rate=100.0, bfloat16_rate=114.8, threads=2)
    assert near.choice == "float32"
    line = ComputeDtype(near.choice, near).describe()
    # 1.148 is not rounded onto the 1.15 bar it missed
    assert line.startswith("compute dtype: float32 (auto): bf16 ran 1.148x as fast as fp32")
    assert "under the 1.15x" in line
    fast = PrecisionProbe(float32_rate=171.0, bfloat16_rate=765.0, threads=2, cached=True)
    line = ComputeDtype(fast.choice, fast).describe()
    assert line.startswith("compute dtype: bfloat16 (auto): bf16 ran 4.47x as fast as fp32")
    assert "at least the 1.15x" in line and line.endswith("cached)")


# ------------------------------------------------------------ 4. a config given to the wrong command


def test_rlvr_train_and_sft_name_the_other_kind_of_config():
    runner = CliRunner()
    sft_file = ROOT / "configs/rlvr/quickstart_sft.yaml"
    error = one_line_error(runner.invoke(app, ["rlvr", "train", str(sft_file)]))
    assert error == f"error: {sft_file} is an SFT config: run `rlscale sft {sft_file}`"
    rl_file = ROOT / "configs/rlvr/quickstart.yaml"
    error = one_line_error(runner.invoke(app, ["sft", str(rl_file)]))
    assert error == f"error: {rl_file} is an RL config: run `rlscale rlvr train {rl_file}`"


def test_a_broken_config_of_the_right_kind_keeps_its_own_message(tmp_path):
    from rlscale.rlvr.config import RLVRConfig, SFTConfig, config_kind

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"path": "m"}, "train": {"lr": -1}}))
    error = one_line_error(CliRunner().invoke(app, ["rlvr", "train", str(path)]))
    assert "train.lr" in error
    assert config_kind({"task": {}}) is None  # keys both kinds have: no guess
    assert config_kind({"init_preset": "tiny"}) is SFTConfig
    assert config_kind({"objective": "grpo"}) is RLVRConfig


# ------------------------------------------------------------------------------------- 5. help


def test_help_has_no_type_noise_and_keeps_names_whole(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    runner = CliRunner()
    train = runner.invoke(app, ["rlvr", "train", "--help"])
    assert train.exit_code == 0
    assert "<bool>" not in train.stdout and "…" not in train.stdout
    assert "--allow-config-change / --no-allow-config-change" in train.stdout
    zero = runner.invoke(app, ["zero", "--help"]).stdout
    # each command's first paragraph whole, not cut at the first full stop or 80 columns
    assert "The model with 0, 1, 2, 4, ... simulations against its raw" in zero
    assert "policy: table + PNG." in zero
    rlvr = runner.invoke(app, ["rlvr", "--help"]).stdout
    assert "(e.g. base" in rlvr and "against trained)." in rlvr


# ---------------------------------------------------------------------------------- 6. version


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"rlscale {importlib.metadata.version('rlscale')}\n"


# ----------------------------------------------------------------------- 7. experiments list


def test_experiments_list_imports_no_experiment():
    """`list` reads the claims from the modules' source: no torch, no matplotlib (seconds)."""
    probe = ("import sys\nfrom typer.testing import CliRunner\nfrom rlscale.cli import app\n"
             "result = CliRunner().invoke(app, ['experiments', 'list'])\n"
             "assert result.exit_code == 0, result.output\n"
             "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))\n"
             "print(result.stdout, end='')\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    heavy, listing = done.stdout.split("\n", 1)
    assert heavy == "[]"
    from rlscale.experiments.registry import EXPERIMENTS

    assert listing == "".join(f"{name}\n    {e.claim}\n" for name, e in EXPERIMENTS.items())


# ------------------------------------------------------------------ 8. an unknown OpenSpiel game


def test_an_unknown_openspiel_game_is_one_line_with_close_names(capfd):
    pytest.importorskip("pyspiel")
    from rlscale.zero.games import make_game

    with pytest.raises(ValueError, match=r"unknown OpenSpiel game 'nosuchgame'; ") as caught:
        make_game("openspiel:nosuchgame")
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"'conect_four' \(did you mean connect_four"):
        make_game("openspiel:conect_four")
    assert capfd.readouterr().err == ""  # OpenSpiel's own 127-line list never printed
