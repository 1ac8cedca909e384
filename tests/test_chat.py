"""Chat models: a tiny random-initialised Llama whose tokenizer carries a real chat template
(Qwen2-Instruct's ChatML), prompts as chat messages from a data file, `model.system_prompt`."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlscale.config import load_config
from rlscale.rlvr.config import RLVRConfig
from rlscale.rlvr.model import ModelLoadError, PromptFormatter, build_char_tokenizer, save_model
from rlscale.rlvr.tasks import ChatMessage, Example

# Qwen2-Instruct's chat template, verbatim (ChatML with a default system message).
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"  # a chat model's turn ends its completion
    tokenizer.chat_template = CHATML
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return save_model(LlamaForCausalLM(config), tokenizer, tmp_path_factory.mktemp("chat") / "m")


def test_formatter_renders_messages_and_system_prompt(chat_model_dir):
    from rlscale.rlvr.model import load_tokenizer

    tokenizer = load_tokenizer(chat_model_dir)
    ex = Example("Halve 7.", "3.5")
    plain = PromptFormatter(tokenizer, chat_template=True)(ex)
    assert plain == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                     "<|im_start|>user\nHalve 7.<|im_end|>\n<|im_start|>assistant\n")
    with_system = PromptFormatter(tokenizer, True, system_prompt="Answer in LaTeX.")(ex)
    assert with_system.startswith("<|im_start|>system\nAnswer in LaTeX.<|im_end|>\n")
    # Messages that bring their own system message keep it.
    chat = Example("x", "3.5", messages=(ChatMessage("system", "Be brief."),
                                         ChatMessage("user", "Halve 7.")))
    assert PromptFormatter(tokenizer, True, system_prompt="ignored")(chat).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHalve 7.")
    # The special tokens are single tokens, as in the real model.
    ids = tokenizer(plain, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3
    # A plain model: the system prompt is a first line; chat messages are an error.
    assert PromptFormatter(tokenizer, system_prompt="Be brief.")(ex) == "Be brief.\nHalve 7."
    with pytest.raises(ModelLoadError, match="chat messages but model.chat_template is false"):
        PromptFormatter(tokenizer)(chat)


def test_rl_steps_on_chat_prompts(tmp_path, chat_model_dir):
    from rlscale.rlvr.loop import train
    from rlscale.runtime.metrics import read_metrics

    rows = [{"messages": [{"role": "user", "content": f"Halve {2 * n}."}], "answer": f"${n}$"}
            for n in range(1, 40)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "c.yaml"
    config.write_text(f"""
run_dir: {tmp_path / 'run'}
model: {{path: {chat_model_dir}, chat_template: true, system_prompt: "Answer with a number."}}
task: {{name: "jsonl:{data}", options: {{test_share: 0.2}}}}
rollout: {{prompts_per_step: 4, group_size: 2, max_new_tokens: 6}}
train: {{steps: 2}}
eval: {{every: 2, prompts: 4}}
checkpoint: {{every: 0}}
progress: false
tensorboard: false
""")
    train(load_config(RLVRConfig, config))
    metrics = read_metrics(tmp_path / "run")
    assert len(metrics) == 2 and "eval/pass@1" in metrics[-1]
    assert (tmp_path / "run" / "final" / "config.json").exists()
