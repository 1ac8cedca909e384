"""docs/config.md is generated from the configs: up to date, every field described, and every
documented default is the value the config really takes."""

from pathlib import Path

import pytest

from rlscale import config_docs
from rlscale.config import apply_overrides, build_config, config_to_dict

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / config_docs.DEFAULT_OUT

# The smallest valid file of each command's config, to set one documented default into.
BASES = {
    "rlscale rlvr train": lambda: {"model": {"path": "models/base"}},
    "rlscale sft": lambda: {"init_preset": "tiny"},
    "rlscale rlvr eval": lambda: {"model": "models/base"},
    "rlscale zero train": dict,
    "rlscale fleet simulate": lambda: {
        "workload": {"steps": 1, "prompts_per_step": 1, "group_size": 1, "prompt_tokens": 0,
                     "response": {"median": 1, "max": 1}},
        "inference": {"workers": 1, "slots": 1, "decode_base_s": 0.001, "decode_per_slot_s": 0},
        "trainer": {"step_base_s": 0, "step_per_token_s": 0}},
}


def test_every_config_field_has_a_description():
    gaps = config_docs.undocumented()
    assert not gaps, ("config fields without a description (add Field(description=...) or a "
                      f"note in rlscale/config_docs.py NOTES): {', '.join(gaps)}")


def test_notes_name_fields_that_need_them():
    stale = config_docs.stale_notes()
    assert not stale, f"stale notes in rlscale/config_docs.py NOTES: {'; '.join(stale)}"


def test_docs_config_md_is_up_to_date():
    if not DOC.is_file() or DOC.read_text() != config_docs.render():
        pytest.fail(f"{config_docs.DEFAULT_OUT} is stale: run `{config_docs.COMMAND}`",
                    pytrace=False)


@pytest.mark.parametrize("command", config_docs.COMMANDS, ids=lambda c: c.title)
def test_documented_defaults_are_the_configs_defaults(command):
    """Each default, read back as YAML the way a `key=value` override is, gives the value a
    config that leaves the key out has."""
    base = BASES[command.title]
    reference = config_to_dict(build_config(command.model, base()))
    checked = 0
    for section in config_docs.sections(command.model):
        for row in section.rows:
            if row.default == "required" or "[]" in row.key or _lookup(base(), row.key) is not None:
                continue  # no default, a list's entries, or a key the base file sets
            parent = row.key.rpartition(".")[0]
            if parent and _lookup(reference, parent) is None:
                continue  # inside an optional section that is absent by default
            data = apply_overrides(base(), [f"{row.key}={row.default.strip('`')}"])
            got = config_to_dict(build_config(command.model, data))
            assert _lookup(got, row.key) == _lookup(reference, row.key), row.key
            checked += 1
    assert checked >= 5


def _lookup(data, key):
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def test_render_is_deterministic_and_covers_every_command():
    text = config_docs.render()
    assert text == config_docs.render()
    for command in config_docs.COMMANDS:
        assert f"\n## {command.title}\n" in text
    assert "| `train.lr` |" in text and "| `mcts.simulations` |" in text


def test_main_writes_the_file(tmp_path):
    out = tmp_path / "docs" / "config.md"
    assert config_docs.main([str(out)]) == 0
    assert out.read_text() == config_docs.render()
