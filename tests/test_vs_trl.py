"""benchmarks/vs_trl.py: its workload helpers (both sides get the same prompts, tokens, LoRA
settings), and end to end on its smallest cells: both sides train and are timed."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOLLM = REPO / "runs" / "smollm" / "base"
SMOLLM_CONFIG = REPO / "configs" / "rlvr" / "smollm.yaml"
needs_smollm = pytest.mark.skipif(not (SMOLLM / "config.json").is_file(),
                                  reason="runs/smollm/base is not there (make smollm)")


@pytest.fixture(scope="module")
def vs_trl():
    path = REPO / "benchmarks" / "vs_trl.py"
    spec = importlib.util.spec_from_file_location("vs_trl_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_trl_bench"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_workload_from_config_and_from_task(vs_trl):
    from rlscale.config import read_yaml

    data = read_yaml(SMOLLM_CONFIG)
    w = vs_trl.load_workload(str(SMOLLM_CONFIG), None)
    assert (w["task"], w["options"]) == (data["task"]["name"], data["task"]["options"])
    assert w["chat_template"] is True and w["lr"] == pytest.approx(data["train"]["lr"])
    plain = vs_trl.load_workload(None, "countdown")
    assert plain["task"] == "countdown" and not plain["chat_template"]
    assert plain["lr"] == vs_trl.LR and vs_trl.load_workload(None, None)["task"] == "arithmetic"


def test_rlscale_config_carries_the_workload_and_lora(vs_trl, tmp_path):
    w = vs_trl.load_workload(str(SMOLLM_CONFIG), None)
    job = vs_trl.Job(str(SMOLLM), str(tmp_path / "run"), 16, 1, 1, 2, "bf16", "full", w)
    full = vs_trl.rlscale_config(job)
    assert full.task.name == "arithmetic" and full.task.options == w["options"]
    assert full.model.chat_template and full.model.lora is None
    assert full.train.lr == pytest.approx(w["lr"]) and full.rollout.max_new_tokens == 16
    job.tuning = "lora"
    lora = vs_trl.rlscale_config(job)
    assert lora.model.lora is not None and lora.train.lr == pytest.approx(10 * w["lr"])
    # the LoRA both sides get is rlscale's model.lora default
    assert lora.model.lora.model_dump(exclude={"save"}) == vs_trl.LORA


def test_trl_peft_config_is_rlscales(vs_trl):
    pytest.importorskip("peft")
    assert vs_trl.trl_peft_config("full") is None
    config = vs_trl.trl_peft_config("lora")
    assert (config.r, config.lora_alpha, config.lora_dropout) == (8, 16.0, 0.0)
    assert config.target_modules == "all-linear" and config.task_type == "CAUSAL_LM"


def test_step_prompts_are_the_loops_draws(vs_trl):
    """One generator per step, seeded as rlscale's rollout source seeds draw 0."""
    from rlscale.rlvr.rollout.groups import step_seed
    from rlscale.rlvr.tasks import make_task

    task = make_task("arithmetic")
    steps = vs_trl.step_prompts(task, 2)
    for step, batch in enumerate(steps):
        rng = random.Random(step_seed(vs_trl.SEED, step, "prompts:0"))
        assert [ex.prompt for ex in batch] == [task.sample("train", rng).prompt
                                               for _ in range(vs_trl.PROMPTS)]
    assert len({ex.prompt for ex in steps[0]}) > 1


def test_completion_text_of_plain_and_conversational(vs_trl):
    assert vs_trl.completion_text("8") == "8"
    assert vs_trl.completion_text([{"role": "assistant", "content": "It is 8."}]) == "It is 8."


@needs_smollm
@pytest.mark.parametrize("system", [None, "Answer briefly."])
def test_trl_chat_prompt_tokenizes_as_rlscale_renders_it(vs_trl, system):
    """TRL applies the chat template to the dataset's messages: the same ids rlscale samples
    from (its PromptFormatter's text, tokenized without special tokens)."""
    from rlscale.rlvr.model import load_tokenizer

    tokenizer = load_tokenizer(SMOLLM)
    w = {**vs_trl.load_workload(str(SMOLLM_CONFIG), None), "system_prompt": system}
    fmt = vs_trl.formatter(tokenizer, w)
    task = vs_trl.make_workload_task(w)
    rng = random.Random(0)
    for example in (task.sample("train", rng) for _ in range(5)):
        messages = vs_trl.trl_prompt(example, w, fmt)
        assert messages[-1] == {"role": "user", "content": example.prompt}
        trl_ids = tokenizer.apply_chat_template(
            conversation=[messages], add_generation_prompt=True, tokenize=True,
            return_dict=True)["input_ids"][0]
        assert list(trl_ids) == tokenizer(fmt(example), add_special_tokens=False)["input_ids"]


def test_missing_model_folder_says_how_to_make_it(vs_trl, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        vs_trl.model_specs(f"smollm2={tmp_path / 'smollm' / 'base'}")
    assert "make smollm" in str(exc.value)
    with pytest.raises(SystemExit):
        vs_trl.tunings("full,qlora")


def test_lora_bound_counts_no_weight_gradients(vs_trl):
    rates = {"fp32_flops": 1e11, "bf16_flops": 5e11, "bandwidth": 1e10}
    full = vs_trl.lower_bound(1e8, 30, 128, rates, "bf16")
    lora = vs_trl.lower_bound(1e8, 30, 128, rates, "bf16", tuning="lora")
    assert 0 < lora < full


def run_bench(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "vs_trl.py"), "--steps", "1", "--warmup", "1",
         "--repeats", "1", "--tokens", "16", "--out", str(tmp_path), *args],
        cwd=REPO, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_vs_trl_smoke_table(tmp_path):
    pytest.importorskip("trl")
    proc = run_bench(tmp_path, "--models", "tiny", "--precision", "fp32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| fp32 | full | tiny")]
    assert len(rows) == 1, proc.stdout
    ratio = re.search(r"\| ([0-9.]+)x \|", rows[0])
    assert ratio is not None and float(ratio.group(1)) > 0, rows[0]
    cell = json.loads((tmp_path / "results.json").read_text())["cells"][0]
    # the bound at the lengths each side sampled never exceeds the full-budget one, and is
    # that one when every row ran the whole budget
    for side in ("rlscale", "trl"):
        at_lengths = cell["lower_bound_at_sampled_lengths_s"][side]
        assert 0 < at_lengths <= cell["lower_bound_s"] * (1 + 1e-9)
        if cell[side]["mean_length"] == 16:
            assert at_lengths == pytest.approx(cell["lower_bound_s"])
    assert cell["runs"]["trl"][0]["generation_in_window"]
    assert cell["same_prompts"] and cell["prompt_ids_match"]
    for side in ("rlscale", "trl"):
        run = cell["runs"][side][0]
        assert run["steps"] == 2 and len(run["step_s"]) == 1
        assert 0 < run["length"][0] <= 16


@pytest.mark.slow
@needs_smollm
def test_vs_trl_smollm_full_and_lora(tmp_path):
    """SmolLM2 through its chat template on both sides, full fine-tuning and LoRA."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    proc = run_bench(tmp_path, "--models", f"smollm2={SMOLLM}", "--config", str(SMOLLM_CONFIG),
                     "--precision", "bf16", "--tuning", "full,lora")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for tuning in ("full", "lora"):
        assert f"| bf16 | {tuning} | smollm2" in proc.stdout, proc.stdout
    assert "warning" not in proc.stdout, proc.stdout
    cells = json.loads((tmp_path / "results.json").read_text())["cells"]
    assert [c["tuning"] for c in cells] == ["full", "lora"]
    assert cells[1]["lr"] == pytest.approx(10 * cells[0]["lr"])
    for cell in cells:
        trl = cell["runs"]["trl"][0]
        assert cell["same_prompts"] and cell["prompt_ids_match"]
        assert 2 in trl["eos_ids"]  # <|im_end|>
        for side in ("rlscale", "trl"):
            assert 0 < cell["runs"][side][0]["length"][0] <= 16
