"""The `rlscale` command: user errors are one line and exit 2; eval prints one JSON object."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlscale.cli import app


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    # the CLI sets torch to all cores unless OMP_NUM_THREADS is set
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny"
    result = CliRunner().invoke(app, ["rlvr", "init-model", "--preset", "tiny", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out) in result.stdout
    return out


def assert_one_line_error(result, *words):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def write_config(tmp_path, data):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_init_model_writes_a_hf_folder(model_dir):
    assert (model_dir / "config.json").is_file()
    assert (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer_config.json").is_file()


def test_init_model_unknown_preset(runner, tmp_path):
    result = runner.invoke(app, ["rlvr", "init-model", "--preset", "giant", "--out",
                                 str(tmp_path / "m")])
    assert_one_line_error(result, "giant")


def test_train_unknown_field_in_config(runner, tmp_path, model_dir):
    path = write_config(tmp_path, {"model": {"path": str(model_dir)}, "run_dir": str(tmp_path / "r"),
                                   "train": {"steps": 1, "lrr": 0.1}})
    assert_one_line_error(runner.invoke(app, ["rlvr", "train", str(path)]), "train.lrr")
    assert not (tmp_path / "r").exists()


def test_train_unknown_field_via_override(runner, tmp_path, model_dir):
    path = write_config(tmp_path, {"model": {"path": str(model_dir)}, "run_dir": str(tmp_path / "r")})
    result = runner.invoke(app, ["rlvr", "train", str(path), "rollout.groupsize=4"])
    assert_one_line_error(result, "rollout.groupsize")


def test_train_ill_typed_override(runner, tmp_path, model_dir):
    path = write_config(tmp_path, {"model": {"path": str(model_dir)}, "run_dir": str(tmp_path / "r")})
    assert_one_line_error(runner.invoke(app, ["rlvr", "train", str(path), "train.steps=abc"]),
                          "train.steps")


def test_train_missing_config_file(runner, tmp_path):
    missing = tmp_path / "nope.yaml"
    assert_one_line_error(runner.invoke(app, ["rlvr", "train", str(missing)]), str(missing))


def test_train_missing_model_path(runner, tmp_path):
    missing = tmp_path / "no-model-here"
    path = write_config(tmp_path, {"model": {"path": str(missing)}, "run_dir": str(tmp_path / "r"),
                                   "train": {"steps": 1}})
    assert_one_line_error(runner.invoke(app, ["rlvr", "train", str(path)]), str(missing))


def test_train_unknown_task(runner, tmp_path, model_dir):
    path = write_config(tmp_path, {"model": {"path": str(model_dir)}, "run_dir": str(tmp_path / "r"),
                                   "task": {"name": "sudoku"}})
    assert_one_line_error(runner.invoke(app, ["rlvr", "train", str(path)]), "sudoku")


def test_eval_unknown_task(runner, model_dir):
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(model_dir), "--task", "nope"])
    assert_one_line_error(result, "nope", "arithmetic")


def test_eval_missing_model(runner, tmp_path):
    missing = tmp_path / "absent"
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(missing), "--task", "arithmetic"])
    assert_one_line_error(result, str(missing))


def test_eval_json(runner, model_dir):
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(model_dir), "--task", "arithmetic",
                                 "--prompts", "20", "--samples", "2", "--k", "1,2", "--json"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, result.stdout
    row = json.loads(lines[0])
    assert isinstance(row, dict)
    assert {"pass@1", "pass@2", "n"} <= set(row)
    assert row["n"] == 20
    assert row["samples"] == 2
    assert 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0


def test_eval_with_a_train_config(runner, model_dir, monkeypatch):
    """--config takes the task (a data file here, with its options) from a train config."""
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # the config names examples/... relative to the repository
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(model_dir), "--config",
                                 "configs/rlvr/math_jsonl.yaml", "--prompts", "10", "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["n"] == 10 and 0.0 <= row["pass@1"] <= 1.0
    both = runner.invoke(app, ["rlvr", "eval", "--model", str(model_dir), "--task", "arithmetic",
                               "--config", "configs/rlvr/math_jsonl.yaml"])
    assert_one_line_error(both, "--task", "--config")


def test_eval_reasoning_config_reports_behaviour_and_lengths(runner, model_dir, monkeypatch):
    """`--config configs/rlvr/reasoning.yaml` evaluates on its task, and --json carries the
    behaviour counters, right/wrong lengths and per-difficulty figures the report uses."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(model_dir), "--config",
                                 "configs/rlvr/reasoning.yaml", "--prompts", "6", "--samples",
                                 "2", "--k", "1,2", "--max-new-tokens", "12", "--split", "ood",
                                 "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["n"] == 6 and {"pass@1", "pass@2", "behaviour/guess", "behaviour/checks",
                              "behaviour/no_answer"} <= set(row)
    assert any(key.startswith("difficulty/") for key in row)
    assert "length/wrong_mean" in row  # an untrained model is wrong


def test_quickstart_unknown_recipe_is_one_line(runner, tmp_path):
    result = runner.invoke(app, ["quickstart", "chess", "--out", str(tmp_path / "q")])
    assert_one_line_error(result, "chess", "reasoning")
    assert not (tmp_path / "q").exists()


def test_eval_text_output(runner, model_dir):
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(model_dir), "--task", "countdown",
                                 "--prompts", "5", "--k", "1,2"])
    assert result.exit_code == 0, result.output
    assert "pass@1:" in result.stdout and "pass@2:" in result.stdout
    assert "prompts: 5" in result.stdout and "samples/prompt: 2" in result.stdout  # n = max k


@pytest.mark.parametrize("args, words", [
    (["--k", "1,8", "--samples", "4"], ["pass@8", "4"]),
    (["--k", "0"], ["--k"]),
    (["--k", ""], ["--k"]),
])
def test_eval_bad_k(runner, model_dir, args, words):
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(model_dir), "--task", "arithmetic",
                                 "--prompts", "2", *args])
    assert_one_line_error(result, *words)


def test_eval_non_integer_k_is_one_line(runner, model_dir):
    result = runner.invoke(app, ["rlvr", "eval", "--model", str(model_dir), "--task", "arithmetic",
                                 "--prompts", "2", "--k", "1,two"])
    assert_one_line_error(result, "--k", "1,two")


def test_passk_plots_several_models_on_one_chart(runner, model_dir, tmp_path):
    out = tmp_path / "passk.png"
    result = runner.invoke(app, ["rlvr", "passk", "--model", str(model_dir), "--model",
                                 str(model_dir), "--task", "arithmetic", "--prompts", "4",
                                 "--k", "1,2,4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 1000
    curves = json.loads(out.with_suffix(".json").read_text())
    assert list(curves) == [str(model_dir)]  # the same folder twice is one line
    values = curves[str(model_dir)]
    assert set(values) == {"1", "2", "4"}
    assert values["1"] <= values["2"] <= values["4"]  # pass@k never falls with k


def test_the_command_line_is_thin():
    """Every command module is in rlscale/cli/, where a command parses its options, builds a
    config and calls the library: no function there grows past 80 lines."""
    import ast

    package = Path(__file__).resolve().parents[1] / "src" / "rlscale" / "cli"
    long = [f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sorted(package.glob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > 80]
    assert long == []
