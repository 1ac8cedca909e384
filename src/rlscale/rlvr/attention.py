"""The trainer's attention on a CPU in bf16: matmuls and a softmax instead of SDPA's kernel.

PyTorch's CPU flash-attention kernel is fast forward but slow backward in bf16: at the GRPO
step's shapes (64 sequences x 8 heads x 134 tokens x 64 dims, 2 threads, AMX Xeon) its
backward took 254-287 ms against 87-90 ms in fp32, and the 10 layers of the 31.5 M model
spent 2.9 s of a 9.2 s bf16 update there, nearly as much as in all the model's matmuls
(3.3 s). The same math as two batched matmuls around a softmax runs on the CPU's bf16
matrix units, and autograd's backward of it took 26 ms forward and 40 ms backward at that
shape, with SDPA's accuracy (both ~5e-3 relative to fp64, gradients included;
tests/test_attention.py).

The price is memory: autograd keeps each layer's `[B, H, T, S]` probabilities (bf16) for the
backward, which flash attention recomputes. Above MAX_SCORES elements per layer (128 MiB of
bf16) the call stays on SDPA. fp32 stays on SDPA too (its backward is the faster one there),
as do forwards without a gradient and single-token decode steps: where it pays is measured,
not assumed (`pays`).
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "rlscale_matmul"
MAX_SCORES = 2 ** 26  # B x H x T x S per layer; 128 MiB of bf16 kept for the backward


def compute_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype attention computes in: the autocast dtype where autocast is on (the query
    itself is fp32 there, promoted by the rotary embedding's fp32 cos and sin), else the
    query's."""
    device = query.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else query.dtype


def pays(query: torch.Tensor, keys: int) -> bool:
    """Where matmul attention beats SDPA (measured): a CPU, bf16 or fp16 compute (autocast),
    a multi-token forward that will be differentiated, scores within MAX_SCORES."""
    b, h, t, _ = query.shape
    return (query.device.type == "cpu" and compute_dtype(query) in (torch.bfloat16, torch.float16)
            and t > 1 and torch.is_grad_enabled() and query.requires_grad
            and b * h * t * keys <= MAX_SCORES)


def matmul_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v over `[B, H, T, D]` q and `[B, H, S, D]` k, v (heads
    already repeated), `mask` bool broadcastable to `[B, H, T, S]` (True: attend) or None
    (causal, aligned to the last key). A masked score is the dtype's lowest value rather than
    -inf, so a query that attends to nothing (a left-padding position) averages instead of
    turning NaN, which would reach the weights' gradients through 0 * NaN."""
    scores = torch.matmul(query * scale, key.transpose(-1, -2))
    if mask is None:
        t, s = scores.shape[-2:]
        mask = torch.ones(t, s, dtype=torch.bool, device=scores.device).tril(s - t)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.matmul(torch.softmax(scores, -1), value)


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """A transformers attention function (AttentionInterface): matmul attention where it
    pays, transformers' own SDPA function, unchanged, everywhere else."""
    if (not pays(query, key.shape[2]) or dropout > 0.0 or kwargs.get("softcap") is not None
            or kwargs.get("position_bias") is not None or kwargs.get("sliding_window")
            or (attention_mask is not None and attention_mask.dtype != torch.bool)
            or (attention_mask is None and not getattr(module, "is_causal", True))):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    dtype = compute_dtype(query)
    query, key, value = (x.to(dtype) for x in (query, key, value))
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    with torch.autocast(query.device.type, enabled=False):  # the dtypes are set: no recasts
        out = matmul_attention(query, key, value, attention_mask, scale)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, attention_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


@contextlib.contextmanager
def training_attention(model):
    """Route `model`'s attention through `attention_forward` inside the block, for models
    on SDPA (others keep theirs). The setting is restored after, so none of it reaches a
    saved config."""
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    if previous != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
