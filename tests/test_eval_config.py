"""`rlscale rlvr eval` builds a typed EvalConfig from its options, with `key=value` overrides on
top as `rlvr train` takes them; the model run is replaced here, so each test takes a moment."""

import json
import typing

import pytest
from typer.testing import CliRunner

import rlscale.rlvr.evaluate as evaluate_module
from rlscale.cli import app
from rlscale.rlvr.config import EvalConfig, HeldOutEvalConfig, RLVRConfig, TrainEvalConfig
from rlscale.rlvr.evaluate import EvalResult
from rlscale.rlvr.tasks.base import EVAL_SPLITS

BASE = ["rlvr", "eval", "--model", "no-model-needed", "--task", "arithmetic"]


@pytest.fixture
def evaluated(monkeypatch):
    """The EvalConfig each `rlvr eval` ran with (no model is loaded)."""
    configs: list[EvalConfig] = []

    def fake_run(cfg, plan, progress=True):
        configs.append(cfg)
        return EvalResult(pass_at={k: 0.5 for k in cfg.ks}, n=cfg.eval.prompts,
                          samples=cfg.samples, mean_length=3.0, seconds=0.1,
                          per_prompt_correct=[])

    monkeypatch.setattr(evaluate_module, "run_eval", fake_run)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return configs


def run(*args):
    return CliRunner().invoke(app, [*BASE, *map(str, args)])


def one_line_error(result, *words):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def test_overrides_land_in_the_typed_config(evaluated):
    result = run("eval.prompts=4", "eval.temperature=0.5", "ks=1,2", "--json")
    assert result.exit_code == 0, result.output
    cfg = evaluated[-1]
    assert (cfg.eval.prompts, cfg.eval.temperature, cfg.ks, cfg.samples) == (4, 0.5, [1, 2], 2)
    assert json.loads(result.stdout) == {"pass@1": 0.5, "pass@2": 0.5, "n": 4, "samples": 2,
                                         "mean_length": 3.0}


def test_the_options_keep_their_meaning(evaluated):
    result = run("--prompts", 7, "--samples", 3, "--k", "3,1", "--temperature", 0.7, "--top-p",
                 0.9, "--seed", 5, "--split", "train", "--max-new-tokens", 6, "--chat-template")
    assert result.exit_code == 0, result.output
    cfg = evaluated[-1]
    assert cfg.eval == HeldOutEvalConfig(prompts=7, samples=3, temperature=0.7, seed=5)
    assert (cfg.ks, cfg.top_p, cfg.split, cfg.max_new_tokens, cfg.chat_template, cfg.output) == (
        [1, 3], 0.9, "train", 6, True, "text")
    assert "pass@3: 0.5000" in result.stdout and "prompts: 7  samples/prompt: 3" in result.stdout
    assert run().exit_code == 0  # the defaults: 500 prompts, n = the largest k
    assert evaluated[-1].eval.prompts == 500 and evaluated[-1].samples == 1


def test_an_override_wins_over_an_option(evaluated):
    assert run("--prompts", 10, "eval.prompts=4", "output=json").exit_code == 0
    assert evaluated[-1].eval.prompts == 4 and evaluated[-1].output == "json"


@pytest.mark.parametrize("override", ["eval.promts=4", "eval.every=5", "top_k=3"])
def test_an_unknown_key_is_one_line_naming_it(evaluated, override):
    key = override.partition("=")[0]
    one_line_error(run(override), f"unknown field '{key}'", override)
    assert evaluated == []


def test_a_bad_value_is_blamed_on_the_override_or_the_option_that_set_it(evaluated):
    assert "--prompts" not in one_line_error(run("eval.prompts=0"), "eval.prompts=0")
    one_line_error(run("--prompts", 10, "eval.prompts=0"), "eval.prompts=0")
    one_line_error(run("--top-p", 0), "--top-p")
    one_line_error(run("ks=[1,0]"), "ks=[1,0]", "positive")
    one_line_error(run("eval.prompts"), "'eval.prompts'", "key=value")
    one_line_error(run("eval.temperature=0", "ks=1,4"), "greedily")  # the run's own check
    assert evaluated == []


def test_the_eval_keys_have_one_home():
    """A training run's `eval:` section is the command's `eval` keys plus `every`."""
    assert set(TrainEvalConfig.model_fields) == set(HeldOutEvalConfig.model_fields) | {"every"}
    assert RLVRConfig.model_fields["eval"].annotation is TrainEvalConfig
    assert EvalConfig.model_fields["eval"].annotation is HeldOutEvalConfig
    assert set(typing.get_args(EvalConfig.model_fields["split"].annotation)) == set(EVAL_SPLITS)
    assert EvalConfig(model="m", ks=[8, 1, 8]).ks == [1, 8]
    assert EvalConfig(model="m", ks=8, eval={"samples": 16}).samples == 16
