"""LoRA through peft: train low-rank adapters on a frozen base model.

The reference policy of a KL penalty is the base model itself, reached by disabling the
adapters for one forward (`reference_logprobs` in the trainer) instead of a second copy of
the weights. Checkpoints hold the adapters alone (plus the optimiser state); the final model
is saved merged (a plain Hugging Face folder, the default) or as the adapter folder peft
writes (`model.lora.save: adapter`, loadable with the base beside it).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from ..runtime.rundir import MODEL_MARKER

ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoraError(ValueError):
    """LoRA cannot be set up (one-line message)."""


def _peft():
    try:
        import peft
    except ImportError:
        raise LoraError("model.lora needs peft, which is not installed: pip install "
                        "'rlscale[lora]'") from None
    return peft


def apply_lora(model, settings, seed: int = 0):
    """`model` wrapped with fresh adapters (B = 0: the wrapped model starts as the base; A
    drawn from `seed`, not from the global random state, so a run's adapters are its own)."""
    peft = _peft()
    config = peft.LoraConfig(r=settings.r, lora_alpha=settings.alpha,
                             lora_dropout=settings.dropout,
                             target_modules=settings.target_modules, task_type="CAUSAL_LM")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return peft.get_peft_model(model, config)
    except ValueError as exc:  # e.g. target modules the model does not have
        raise LoraError(f"model.lora: {str(exc).strip().splitlines()[0]}") from None


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def save_adapter(model, tokenizer, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / MODEL_MARKER).write_text("a LoRA adapter folder written by rlscale\n")
    return out


def load_adapter(model, folder: Path) -> None:
    """Put the adapter weights saved in `folder` (by `save_adapter`) into `model`."""
    peft = _peft()
    from safetensors.torch import load_file

    peft.set_peft_model_state_dict(model, load_file(folder / ADAPTER_WEIGHTS))


def merged_copy(model):
    """A plain model with the adapters folded into its weights; `model` is left as it is."""
    return copy.deepcopy(model).merge_and_unload()


def save_weights(model, tokenizer, out: Path) -> Path:
    """What a checkpoint holds of the model: the adapters when it has them (the base never
    changes), else the whole model."""
    from .model import save_model

    if is_lora(model):
        return save_adapter(model, tokenizer, out)
    return save_model(model, tokenizer, out)


def save_trained(model, tokenizer, out: Path, settings) -> Path:
    """The trained model as `settings.save` asks (`settings` None: not LoRA, saved whole)."""
    from .model import save_model

    if settings is not None and settings.save == "merged":
        return save_model(merged_copy(model), tokenizer, out)
    return save_weights(model, tokenizer, out)
