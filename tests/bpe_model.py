"""A tiny Llama with a byte-level BPE tokenizer trained on the fly, a ChatML chat template and
`<|im_end|>` as its end of turn: a pretrained instruct model's shape (a real vocabulary, a
template, special stop tokens) at a size a test builds in a second."""

from __future__ import annotations

import random
from pathlib import Path

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus(lines: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["What", "is", "the", "answer", "sum", "of", "and", "so", "add", "them", "="]
    out = []
    for _ in range(lines):
        a, b = rng.randrange(100), rng.randrange(100)
        out.append(f"What is {a} + {b}? {a} + {b} = {a + b}. "
                   + " ".join(rng.choice(words) for _ in range(4)))
    return out


def build_bpe_model(out: Path, vocab_size: int = 400, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from rlscale.rlvr.model import save_model

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus(seed=seed), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|im_end|>", unk_token="<|endoftext|>", padding_side="left")
    tokenizer.chat_template = CHATML
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return save_model(LlamaForCausalLM(config), tokenizer, out)


# The task and config the BPE path tests share (tests/test_bpe_paths.py, test_bpe_runs.py).
OPTIONS = {"style": "question", "add_digits": 1, "mul_share": 0.0, "test_share": 0.3}
TASK = {"name": "arithmetic", "options": OPTIONS}
QUIET = {"tensorboard": False, "progress": False}


def rl_config(model_dir: Path, run_dir: Path, **sections):
    """A short GRPO config on a BPE model through its chat template; `sections` merge into
    (a dict) or replace (anything else) the config's top-level keys."""
    from rlscale.config import build_config
    from rlscale.rlvr.config import RLVRConfig

    cfg = {"model": {"path": str(model_dir), "chat_template": True}, "run_dir": str(run_dir),
           "task": TASK, "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 10},
           "train": {"steps": 2, "lr": 1e-3, "compute_dtype": "float32"},
           "checkpoint": {"every": 0}, **QUIET}
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return build_config(RLVRConfig, cfg)
