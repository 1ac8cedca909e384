"""Every-day RLVR paths on a BPE vocabulary with a chat template (issue 50): loading, prompts
rendered through the template, sampling that stops at `<|im_end|>`, a GRPO run with free-text
answers, and `rlvr eval` with the config's prompt format."""

from __future__ import annotations

import json

import pytest
import torch

from bpe_model import build_bpe_model
from rlscale.config import load_config
from rlscale.rlvr.config import RLVRConfig
from rlscale.rlvr.loop import train
from rlscale.rlvr.model import PromptFormatter, load_model
from rlscale.rlvr.rollout.sampler import SamplingParams, generate
from rlscale.rlvr.tasks import Example


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return build_bpe_model(tmp_path_factory.mktemp("bpe") / "model")


def test_a_bpe_model_loads_renders_its_template_and_stops_at_the_end_of_a_turn(bpe_dir):
    model, tokenizer = load_model(bpe_dir)
    assert 300 <= len(tokenizer) <= 400 and tokenizer.eos_token == "<|im_end|>"
    prompt = PromptFormatter(tokenizer, chat_template=True, system_prompt="Be brief.")(
        Example("What is 3 + 4?", 7))
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                      "What is 3 + 4?<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in ids  # one special token
    assert len(ids) < len(prompt) / 2  # merges: a real vocabulary, not characters
    # A model whose every step prefers <|im_end|> (one hidden dimension held large and
    # positive, read only by the end-of-turn row) stops after one token, in every row.
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(torch.zeros_like(model.lm_head.weight))
        model.lm_head.weight[tokenizer.eos_token_id, 0] = 1.0
        model.model.embed_tokens.weight[:, 0] = 50.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
    rollout = generate(model, [ids, ids[:5]], SamplingParams(max_new_tokens=8, temperature=0.1),
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       generator=torch.Generator().manual_seed(0))
    assert rollout.lengths.tolist() == [1, 1]
    assert rollout.finish_reasons == ["stop", "stop"]


def test_grpo_and_eval_on_a_bpe_model_with_free_text_answers(bpe_dir, tmp_path):
    from typer.testing import CliRunner

    from rlscale.cli import app

    run = tmp_path / "run"
    args = [f"model.path={bpe_dir}", "model.chat_template=true", f"run_dir={run}",
            "task.name=arithmetic", "task.options={style: question, add_digits: 1, "
            "mul_share: 0.0, test_share: 0.3}", "rollout.prompts_per_step=4",
            "rollout.group_size=4", "rollout.max_new_tokens=12", "train.steps=2",
            "train.compute_dtype=float32", "eval.every=2", "eval.prompts=8",
            "checkpoint.every=1", "progress=false", "tensorboard=false"]
    final = train(load_config(RLVRConfig, None, args))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "eval/pass@1" in rows[-1]
    assert all(0 < r["length/mean"] <= 12 for r in rows)
    assert (final / "tokenizer.json").is_file() and (final / "chat_template.jinja").is_file()
    result = CliRunner().invoke(app, ["rlvr", "eval", "--model", str(final), "--config",
                                      str(run / "config.yaml"), "--prompts", "8", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["n"] == 8
