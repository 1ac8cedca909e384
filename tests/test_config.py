"""Strict typed configs: YAML + dotted overrides, one-line errors naming the field."""

from dataclasses import asdict, fields
from pathlib import Path

import pytest
import yaml

from rlscale.config import ConfigError, apply_overrides, dump_config, load_config
from rlscale.rlvr.config import LossConfig, RLVRConfig, SFTConfig
from rlscale.rlvr.objectives import PRESETS, Objective

BASE = {"model": {"path": "models/base"}}


def write(tmp_path, data, name="run.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def config_error(*args) -> str:
    with pytest.raises(ConfigError) as exc_info:
        load_config(*args)
    message = str(exc_info.value)
    assert message and "\n" not in message, message
    assert "Traceback" not in message and "pydantic" not in message.lower()
    return message


def test_minimal_config_gets_defaults(tmp_path):
    cfg = load_config(RLVRConfig, write(tmp_path, BASE))
    assert cfg.model.path == "models/base"
    assert cfg.objective == "grpo"
    assert cfg.task.name == "arithmetic" and cfg.train.steps == 100
    assert cfg.loss.clip_high is None  # left to the preset


def test_unknown_top_level_field(tmp_path):
    message = config_error(RLVRConfig, write(tmp_path, {**BASE, "learning_rate": 1e-4}))
    assert "'learning_rate'" in message and "unknown field" in message


def test_unknown_nested_field(tmp_path):
    message = config_error(RLVRConfig, write(tmp_path, {**BASE, "train": {"lrr": 1e-4}}))
    assert "'train.lrr'" in message and "unknown field" in message


def test_unknown_field_via_override(tmp_path):
    message = config_error(RLVRConfig, write(tmp_path, BASE), ["train.lrr=1"])
    assert "'train.lrr'" in message and "unknown field" in message
    message = config_error(RLVRConfig, write(tmp_path, BASE), ["rollout.groupsize=4"])
    assert "'rollout.groupsize'" in message


def test_ill_typed_override_names_the_field(tmp_path):
    message = config_error(RLVRConfig, write(tmp_path, BASE), ["train.steps=abc"])
    assert "train.steps" in message and "abc" in message
    # out of range is ill-typed too
    assert "rollout.group_size" in config_error(RLVRConfig, write(tmp_path, BASE),
                                                ["rollout.group_size=1"])
    assert "rollout.top_p" in config_error(RLVRConfig, write(tmp_path, BASE),
                                           ["rollout.top_p=1.5"])


def test_ill_typed_yaml_names_the_field(tmp_path):
    message = config_error(RLVRConfig, write(tmp_path, {**BASE, "train": {"lr": "fast"}}))
    assert "train.lr" in message and "fast" in message


def test_a_learning_rate_that_would_overflow_the_optimiser_is_a_config_error(tmp_path):
    # 1e38 used to reach AdamW and end in "value cannot be converted to type float".
    message = config_error(RLVRConfig, write(tmp_path, BASE), ["train.lr=1e38"])
    assert "train.lr" in message and "less than or equal to 10" in message
    from rlscale.zero.config import ZeroConfig

    message = config_error(ZeroConfig, None, ["train.lr_steps={3: 100}"])
    assert "train.lr_steps.3" in message
    assert "train.lr" in config_error(ZeroConfig, None, ["train.lr=-1"])


def test_unknown_objective_is_named(tmp_path):
    message = config_error(RLVRConfig, write(tmp_path, {**BASE, "objective": "grpoo"}))
    assert "'grpoo'" in message and "dapo" in message
    message = config_error(RLVRConfig, write(tmp_path, BASE), ["objective=ppo_magic"])
    assert "'ppo_magic'" in message


def test_missing_required_model(tmp_path):
    message = config_error(RLVRConfig, write(tmp_path, {"objective": "grpo"}))
    assert "model" in message


def test_override_value_parsing(tmp_path):
    cfg = load_config(RLVRConfig, write(tmp_path, BASE), [
        "train.lr=3.0e-4", "rollout.temperature=0.7", "loss.clip_high=0.3",
        "tensorboard=false", "progress=False", "train.post_update_stats=true",
        "train.steps=12", "task.options.ks=[1, 2, 3]", "task.options.mul_digits=[2,2]",
        "task.options.name=text", "task.options.share=0.25", "run_dir=runs/x=y",
    ])
    assert cfg.train.lr == 3e-4 and isinstance(cfg.train.lr, float)
    assert cfg.rollout.temperature == 0.7
    assert cfg.loss.clip_high == 0.3
    assert cfg.tensorboard is False and cfg.progress is False
    assert cfg.train.post_update_stats is True
    assert cfg.train.steps == 12 and isinstance(cfg.train.steps, int)
    assert cfg.task.options == {"ks": [1, 2, 3], "mul_digits": [2, 2], "name": "text",
                                "share": 0.25}
    assert cfg.run_dir == "runs/x=y"  # only the first '=' splits key from value


def test_override_exponent_float_in_typed_field(tmp_path):
    cfg = load_config(RLVRConfig, write(tmp_path, BASE), ["train.lr=1e-4"])
    assert cfg.train.lr == pytest.approx(1e-4) and isinstance(cfg.train.lr, float)


def test_override_exponent_float_in_untyped_options(tmp_path):
    cfg = load_config(RLVRConfig, write(tmp_path, BASE), ["task.options.mul_share=1e-1"])
    assert cfg.task.options["mul_share"] == pytest.approx(0.1)


def test_overrides_win_over_file_and_create_sections(tmp_path):
    path = write(tmp_path, {**BASE, "train": {"lr": 0.01, "steps": 5}})
    cfg = load_config(RLVRConfig, path, ["train.lr=0.02", "eval.prompts=7"])
    assert cfg.train.lr == 0.02 and cfg.train.steps == 5 and cfg.eval.prompts == 7
    cfg = load_config(RLVRConfig, None, ["model.path=m", "train.seed=3"])
    assert cfg.model.path == "m" and cfg.train.seed == 3


@pytest.mark.parametrize("override, words", [
    ("train.lr", ["train.lr", "key=value"]),
    ("=3", ["empty key"]),
    ("train..lr=1", ["empty key"]),
    ("model.path.deeper=1", ["'path'", "not a section"]),
])
def test_malformed_overrides(tmp_path, override, words):
    message = config_error(RLVRConfig, write(tmp_path, BASE), [override])
    for word in words:
        assert word in message


def test_apply_overrides_in_place():
    data = {"a": {"b": 1}}
    assert apply_overrides(data, ["a.c=2", "d.e.f=x"]) is data
    assert data == {"a": {"b": 1, "c": 2}, "d": {"e": {"f": "x"}}}


def test_missing_file_is_one_line(tmp_path):
    missing = tmp_path / "nope.yaml"
    message = config_error(RLVRConfig, missing)
    assert str(missing) in message and "not found" in message


@pytest.mark.parametrize("text", ["model: [unclosed\n", "a: b: c\n", "model:\n  path: x\n\t- y\n"])
def test_invalid_yaml_is_one_line(tmp_path, text):
    path = write(tmp_path, text)
    message = config_error(RLVRConfig, path)
    assert str(path) in message and "invalid YAML" in message


def test_non_mapping_yaml(tmp_path):
    message = config_error(RLVRConfig, write(tmp_path, "- a\n- b\n"))
    assert "mapping" in message


def test_empty_yaml_is_an_empty_mapping(tmp_path):
    cfg = load_config(RLVRConfig, write(tmp_path, ""), ["model.path=m"])
    assert cfg.model.path == "m"


def test_resolved_objective_takes_the_preset(tmp_path):
    cfg = load_config(RLVRConfig, write(tmp_path, BASE), ["objective=dapo"])
    loss = cfg.resolved_objective()
    assert isinstance(loss, Objective)
    assert loss.clip_high == 0.28 and loss.clip_low == 0.2
    assert loss.aggregation == "token-mean"
    assert loss.dynamic_sampling is True and loss.overlong_penalty is True
    assert loss.kl_coef == 0.0
    assert loss.norm_length == cfg.rollout.max_new_tokens == 8  # None -> max_new_tokens
    # fields no preset sets keep the library defaults ("off")
    assert (loss.is_correction, loss.is_threshold) == ("none", 2.0)
    assert loss.length_penalty_per_token == 0.0 and loss.adaptive_length_penalty == 0.0
    assert loss.entropy_top_rho == 1.0
    assert loss.critic_lr == cfg.train.lr  # None -> train.lr
    assert loss == Objective(**{**asdict(PRESETS["dapo"]), "norm_length": 8,
                                "critic_lr": cfg.train.lr})


def test_resolved_objective_overrides_win(tmp_path):
    cfg = load_config(RLVRConfig, write(tmp_path, BASE), [
        "objective=dapo", "loss.clip_high=0.3", "loss.dynamic_sampling=false",
        "loss.norm_length=64", "rollout.max_new_tokens=16", "loss.is_correction=tis"])
    loss = cfg.resolved_objective()
    assert loss.clip_high == 0.3
    assert loss.clip_low == 0.2           # the preset's, not overridden
    assert loss.dynamic_sampling is False  # a falsy override still wins
    assert loss.norm_length == 64
    assert loss.is_correction == "tis"
    # the preset itself is untouched by a run's overrides
    assert PRESETS["dapo"].clip_high == 0.28 and PRESETS["dapo"].dynamic_sampling is True


def test_resolved_objective_zero_kl_override(tmp_path):
    cfg = load_config(RLVRConfig, write(tmp_path, BASE), ["loss.kl_coef=0"])
    assert PRESETS["grpo"].kl_coef == 0.04
    assert cfg.resolved_objective().kl_coef == 0.0
    assert load_config(RLVRConfig, write(tmp_path, BASE)).resolved_objective().kl_coef == 0.04


def test_loss_section_has_one_field_per_objective_field():
    assert list(LossConfig.model_fields) == [f.name for f in fields(Objective)]


@pytest.mark.parametrize("objective", sorted(PRESETS))
def test_every_preset_resolves_to_valid_loss_fields(tmp_path, objective):
    teacher = {"teacher": {"path": "teacher"}} if PRESETS[objective].uses_teacher else {}
    cfg = load_config(RLVRConfig, write(tmp_path, {**BASE, **teacher}), [f"objective={objective}"])
    loss = asdict(cfg.resolved_objective())
    assert None not in loss.values()
    # the resolved record is itself a valid loss section
    reloaded = load_config(RLVRConfig, write(tmp_path, {**BASE, **teacher, "loss": loss}))
    assert asdict(reloaded.resolved_objective()) == loss


def test_dump_and_reload_round_trips(tmp_path):
    cfg = load_config(RLVRConfig, write(tmp_path, BASE),
                      ["objective=gspo", "train.lr=2e-4", "task.options.add_digits=2"])
    dump_config(cfg, tmp_path / "dumped.yaml")
    assert load_config(RLVRConfig, tmp_path / "dumped.yaml") == cfg


def test_sft_config_needs_exactly_one_start(tmp_path):
    assert load_config(SFTConfig, None, ["init_preset=tiny"]).init_preset == "tiny"
    assert "exactly one" in config_error(SFTConfig, None, [])
    assert "exactly one" in config_error(SFTConfig, None, ["init_preset=tiny", "model.path=m"])
    assert "'data.wrong_shar'" in config_error(SFTConfig, None,
                                               ["init_preset=tiny", "data.wrong_shar=0.1"])


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1]
                                         / "src/rlscale/configs").rglob("*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_loads(path):
    from rlscale.simulator import FleetConfig
    from rlscale.zero.config import ZeroConfig

    if path.parent.name == "zero":
        schema = ZeroConfig
    elif path.parent.name == "fleet":
        schema = FleetConfig
    else:
        schema = SFTConfig if "sft" in path.name else RLVRConfig
    assert load_config(schema, path, []) is not None
