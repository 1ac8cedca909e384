"""Load a local Hugging Face causal LM and its tokenizer; build the `tiny` preset.

The tiny preset is a real Llama-architecture model with a character-level tokenizer, saved
with `save_pretrained`, so everything downstream (sampler, trainer, eval, checkpoints)
runs the same code path it would run on a released checkpoint loaded from disk.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from ..runtime.checkpoint import checkpoint_problem
from ..runtime.device import Workload, parameter_signature
from ..runtime.health import first_non_finite_parameter
from ..runtime.rundir import MODEL_MARKER, check_model_out
from .attention import training_attention
from .rollout.sampler import SamplingParams, generate
from .tasks.base import Example

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
# Printable ASCII and newline: every task text round-trips exactly, spaces included.
CHARACTERS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]

TINY_PRESETS = {
    # ~0.8 M parameters: trains on 2 CPU cores in minutes.
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2),
    # ~6 M parameters, for longer experiments.
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4),
    # ~31.5 M parameters: the largest shape the speed benchmarks time on this CPU.
    "medium": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=10,
                   num_attention_heads=8, num_key_value_heads=4),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}  # float64: exactness checks (tests/test_learner_group.py)


class ModelLoadError(ValueError):
    """The model or tokenizer cannot be loaded (one-line message)."""


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *CHARACTERS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        padding_side="left", clean_up_tokenization_spaces=False,
    )


def build_tiny_model(preset: str = "tiny", seed: int = 0, max_positions: int = 512):
    """A freshly initialised Llama-architecture causal LM and its character tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if preset not in TINY_PRESETS:
        raise ModelLoadError(f"unknown model preset '{preset}' (known: {', '.join(TINY_PRESETS)})")
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
        rope_theta=10000.0, **TINY_PRESETS[preset],
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model, tokenizer


def save_model(model, tokenizer, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # Marks the folder as rlscale's, so `--overwrite` may replace it (and nothing else).
    (out / MODEL_MARKER).write_text("a model folder written by rlscale\n")
    return out


def init_model(preset: str, out: str | Path, seed: int = 0, *, overwrite: bool = False) -> Path:
    from ..runtime.checkpoint import atomic_dir

    out = check_model_out(out, overwrite=overwrite)
    model, tokenizer = build_tiny_model(preset, seed=seed)
    with atomic_dir(out) as tmp:
        save_model(model, tokenizer, tmp)
    return out


def load_tokenizer(path: str | Path):
    path = Path(path)
    # The tiny preset is a Llama model: transformers 5 forces Qwen2's own tokenizer class on
    # any qwen2 folder (dropping our spaces), but honours tokenizer_config.json for llama.
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def check_model_dir(path: str | Path) -> Path:
    """`path` as a local model folder, or a one-line ModelLoadError saying what it is instead."""
    path = Path(path)
    if path.is_file():
        raise ModelLoadError(f"model path is a file, not a model folder: {path}")
    if not path.is_dir():
        raise ModelLoadError(f"model path does not exist: {path}{_written_by(path)}")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"not a Hugging Face model folder (no config.json): {path}")
    return path


def _written_by(path: Path) -> str:
    """A hint for the shipped configs' model paths, which a quickstart writes."""
    writers = {"quickstart": "rlscale quickstart", "reasoning": "rlscale quickstart reasoning",
               "quickstart_tiny": "rlscale quickstart --tiny"}
    parts = Path(path).parts
    if len(parts) >= 2 and parts[0] == "runs" and parts[1] in writers:
        return f" (`{writers[parts[1]]}` writes it: run that first)"
    return ""


def load_model(path: str | Path, dtype: str = "float32"):
    """(model, tokenizer) from a local folder; a clear one-line error if it is not one, or if
    its weights are damaged (a torn or truncated file) or not finite."""
    path = check_model_dir(path)
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype '{dtype}' (known: {', '.join(DTYPES)})")
    # Checked before loading: safetensors reports a torn file as a Rust error that no
    # `except` here would name, with a traceback from deep inside transformers.
    problem = checkpoint_problem(path)
    if problem:
        raise ModelLoadError(f"cannot load model from {path}: {problem}")
    try:
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], local_files_only=True)
    # RuntimeError: weights whose shapes the config contradicts; SafetensorError: a file
    # damaged past what the header check sees (e.g. a dtype it does not know).
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load model from {path}: {first[:200]}") from None
    bad = first_non_finite_parameter(model)  # else torch.multinomial fails on NaN, much later
    if bad is not None:
        raise ModelLoadError(f"cannot load model from {path}: its weights hold NaN/inf in {bad}")
    return model, tokenizer


def check_same_tokenizer(student, teacher, teacher_path: str | Path) -> None:
    """A one-line ModelLoadError unless the teacher's tokenizer maps every token (and the
    special tokens) exactly as the student's: distillation compares log-probs token by
    token, which means nothing across two vocabularies."""
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    if ours != theirs:
        differ = len(set(ours.items()) ^ set(theirs.items()))
        raise ModelLoadError(
            f"teacher {teacher_path} has a different tokenizer than the student (vocab sizes "
            f"{len(theirs)} vs {len(ours)}, {differ} entries differ); distillation needs the same one")
    for special in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(student, special, None) != getattr(teacher, special, None):
            raise ModelLoadError(f"teacher {teacher_path} has a different {special} than the "
                                 "student; distillation needs the same tokenizer")


def load_teacher(path: str | Path, dtype: str, student_tokenizer):
    """A frozen teacher model (eval mode, no gradients) whose tokenizer is the student's."""
    teacher, tokenizer = load_model(path, dtype)
    check_same_tokenizer(student_tokenizer, tokenizer, path)
    return teacher.eval().requires_grad_(False)


@dataclass
class PromptFormatter:
    """Turns an example's prompt into model input text.

    Without a chat template the prompt text is used as it is, after `system_prompt` (and a
    newline) when one is set. With `chat_template`, the example's messages (or its prompt as
    one user message) go through the tokenizer's template with the generation prompt, after
    a system message of `system_prompt` unless the messages bring their own.
    """

    tokenizer: object
    chat_template: bool = False
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ModelLoadError("model.chat_template is true but the tokenizer has no chat template")

    def __call__(self, example: Example) -> str:
        if not self.chat_template:
            if example.messages is not None:
                raise ModelLoadError(
                    "the task's prompts are chat messages but model.chat_template is false "
                    "(set it true, with a tokenizer that has a chat template)")
            return example.prompt if self.system_prompt is None \
                else f"{self.system_prompt}\n{example.prompt}"
        return self.tokenizer.apply_chat_template(self.messages(example), tokenize=False,
                                                  add_generation_prompt=True)

    def messages(self, example: Example) -> list[dict[str, str]]:
        """The chat messages the template renders: the example's own (or its prompt as one
        user message), after a system message of `system_prompt` unless they bring one."""
        messages = [{"role": m.role, "content": m.content} for m in example.messages] \
            if example.messages is not None else [{"role": "user", "content": example.prompt}]
        if self.system_prompt is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def enable_activation_checkpointing(model) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant), with
    the name transformers 5.2x uses and the one before it."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


# What `compute_dtype: auto` times for a language model: both halves of a GRPO step at a
# small task's shape, through the code a run uses: the update's forward (the trainer's
# attention) and backward over 4 x 128 tokens, and the sampler's decode steps for 64 rows
# (8 tokens after an 8-token prompt). A model whose pass would cost more than
# WORKLOAD_MAX_GFLOP is matmul-bound; the matmul probe speaks for it.
WORKLOAD_TRAIN_SHAPE = (4, 128)
WORKLOAD_DECODE_ROWS, WORKLOAD_DECODE_CALLS = 64, 8
WORKLOAD_MAX_GFLOP = 50.0


def precision_workload(model) -> Workload | None:
    """The workload `resolve_compute_dtype` times for `model` (None: too big, use the
    matmul probe). Its passes leave the model as they found it: mode, gradients, RNG."""
    params = [p for p in model.parameters()]
    rows, width = WORKLOAD_TRAIN_SHAPE
    tokens_x_flops = 6 * rows * width + 2 * WORKLOAD_DECODE_ROWS * WORKLOAD_DECODE_CALLS
    if tokens_x_flops * count_parameters(model) / 1e9 > WORKLOAD_MAX_GFLOP:
        return None
    device = params[0].device
    generator = torch.Generator().manual_seed(0)  # drawn on the CPU for every device
    vocab = model.config.vocab_size
    train_ids = torch.randint(vocab, (rows, width), generator=generator).to(device)
    prompts = torch.randint(vocab, (WORKLOAD_DECODE_ROWS, WORKLOAD_DECODE_CALLS),
                            generator=generator).tolist()
    # No token ends a row early (no id is -1), so every pass decodes the same steps.
    sampling = SamplingParams(max_new_tokens=WORKLOAD_DECODE_CALLS, temperature=1.0, top_p=1.0)

    def run() -> None:
        was_training, grads = model.training, [p.grad for p in params]
        model.eval()  # no dropout: it would draw from the global RNG
        try:
            with torch.no_grad():
                generate(model, prompts, sampling, eos_token_id=-1, pad_token_id=0,
                         generator=torch.Generator().manual_seed(0))
            with training_attention(model):
                logits = model(train_ids, use_cache=False).logits
            logits.float().logsumexp(-1).mean().backward()
        finally:
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            model.train(was_training)

    # "lm2": the passes above; results cached for the older workload (HF's forward for the
    # decode, SDPA in the update) are not reused.
    return Workload(f"lm2 {parameter_signature(model)} {rows}x{width}", run)
