"""Decode steps without per-token framework overhead, for the Llama decoder family.

A decode step of a small model on a CPU is dominated by what surrounds the arithmetic: the
Hugging Face forward builds a mask, dispatches the attention interface, grows a
`DynamicCache` by concatenation (an O(length) copy per layer per token), casts every weight
under autocast and wraps outputs in records, on every token. Here one step is the same math
over weights prepared once per `generate` call: q, k, v (and gate, up) fused into one matmul
each, cast once to the compute dtype, keys and values written into a cache preallocated to
the final length (`kv_cache.KVCache`), attention as two batched matmuls against its live
columns.

Written by hand because no maintained library does this for a CPU: vLLM's CPU build and
SGLang need their own environments (vLLM pins transformers < 5.20), and transformers'
`StaticCache` + `torch.compile` recompiles per batch shape and costs minutes of compilation
per run here. The prefill still runs the model's own forward and the rotary embedding is
the model's own module (any rope type); a step computes what the model computes (a test
holds the logits to 1e-5 of the full forward).

Supported: `llama`, `qwen2`, `qwen3`, `mistral` (without a sliding window) with SiLU MLPs
and `nn.Linear` projections, plain or with peft LoRA adapters (folded into the weights once
per call). Anything else returns None from `DecoderWeights.from_model`, and the sampler uses
the model's forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import KVCache

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


@dataclass(frozen=True)
class RMSNormWeights:
    weight: torch.Tensor
    eps: float

    @classmethod
    def of(cls, norm: nn.Module | None, dtype: torch.dtype) -> RMSNormWeights | None:
        return None if norm is None else cls(norm.weight.detach().to(dtype),
                                             norm.variance_epsilon)


def rms_norm(x: torch.Tensor, norm: RMSNormWeights) -> torch.Tensor:
    """The Llama family's RMSNorm: normalised in float32, scaled in the input's dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * x32.to(x.dtype)


# MKL's packed GEMM through PyTorch's own op (the one inductor's weight prepacking emits):
# present in the x86 CPU builds; anywhere else every projection is a plain F.linear.
MKL_PACKED = torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
PACKED_BATCH_SIZES = 4   # packed copies kept per projection (the last batch sizes seen)
# Where the packed GEMM pays (benchmarks/packed_linear.py, 2 threads, AMX Xeon): at 8-32 rows
# it was 0.9-2.4x (1.3-2.4x at 32) F.linear on the 6.3-31.5 M models' projections with >= 256 outputs; at 1
# row 0.55-1.09x, and on the 100-token output layer 0.84-1.27x. At 64 rows it was 1.1-1.5x in
# the table's own run, not yet checked in a whole engine run: the cap stays at 32 for now.
PACKED_MIN_ROWS, PACKED_MAX_ROWS = 8, 32
PACKED_MIN_OUTPUTS = 256
# bf16: oneDNN's linear on a weight reordered once into its blocked layout (the ops inductor
# emits for bf16 weight prepacking). One copy serves every batch size: packed for 64 rows it
# gave F.linear's bits at 1-100 rows (tests/test_decoder.py) and ran 1.0-2.0x faster than
# F.linear on the 6.3-31.5 M models' projections at 1-256 rows in a one-off timing (2
# threads, AMX Xeon); whole engine runs, 1.05-1.3x (docs/performance.md). Packed for 1 row
# it rounds differently at 50+ rows. oneDNN's bf16 kernels need AVX-512 (BW, VL, DQ) or
# AVX-NE-CONVERT: on an AVX2-only CPU the reorder raises, so the check inductor makes before
# it prepacks bf16 weights decides (F.linear emulates bf16 there).
ONEDNN_PACKED = (torch.backends.mkldnn.is_available()
                 and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                 and hasattr(torch.ops.mkldnn, "_linear_pointwise")
                 and hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported")
                 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
ONEDNN_PACK_ROWS = 64


class Projection:
    """One linear map of the decoder, `x W^T + b`, on a CPU through a weight kept packed in
    the GEMM library's own layout, which a plain `F.linear` re-packs on every call, a cost
    that weighs at decode's few rows (measured in docs/performance.md). fp32 with MKL: MKL's
    packed GEMM, whose PyTorch op serves the one batch size it was packed for, so a copy is
    kept for each of the last `PACKED_BATCH_SIZES` sizes seen, and only where it pays (8-32
    rows, >= 256 outputs). bf16 with oneDNN: one packed copy for every size. The results are
    those of `F.linear` (the same kernel families); anything else (fp16, a GPU, neither
    library) is `F.linear` itself."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        on_cpu = weight.device.type == "cpu"
        self.packable = (MKL_PACKED and weight.dtype == torch.float32 and on_cpu
                         and weight.shape[0] >= PACKED_MIN_OUTPUTS)
        self.onednn = ONEDNN_PACKED and weight.dtype == torch.bfloat16 and on_cpu
        self._packed: dict[int, torch.Tensor] = {}

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn and x.dim() == 2 and x.dtype == torch.bfloat16:
            return self._onednn(x)
        rows = x.shape[0]
        if (not self.packable or x.dim() != 2 or x.dtype != torch.float32
                or not PACKED_MIN_ROWS <= rows <= PACKED_MAX_ROWS):
            return F.linear(x, self.weight, self.bias)
        packed = self._packed.get(rows)
        if packed is None:
            if len(self._packed) >= PACKED_BATCH_SIZES:
                self._packed.pop(next(iter(self._packed)))
            packed = self._packed[rows] = torch.ops.mkl._mkl_reorder_linear_weight(
                self.weight, rows)
        return torch.ops.mkl._mkl_linear(x, packed, self.weight, self.bias, rows)

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed.get(ONEDNN_PACK_ROWS)
        if packed is None:  # on first use: a projection never called is never packed
            packed = self._packed[ONEDNN_PACK_ROWS] = torch.ops.mkldnn._reorder_linear_weight(
                self.weight.contiguous(), ONEDNN_PACK_ROWS)
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")


@dataclass(frozen=True)
class LayerWeights:
    qkv: Projection                  # [(H + 2 Hk) d, D]
    out: Projection                  # [D, H d]
    gate_up: Projection              # [2 I, D]
    down: Projection                 # [D, I]
    attn_norm: RMSNormWeights
    mlp_norm: RMSNormWeights
    q_norm: RMSNormWeights | None    # qwen3: RMSNorm over each head before the rotary
    k_norm: RMSNormWeights | None


@dataclass(frozen=True)
class DecoderWeights:
    """The weights of one model, fused and cast for decoding; valid until the next update."""

    layers: tuple[LayerWeights, ...]
    embed: torch.Tensor              # [V, D]
    final_norm: RMSNormWeights
    lm_head: Projection              # [V, D]
    rotary: nn.Module                # the model's rotary embedding (any rope type)
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    scaling: float
    dtype: torch.dtype

    @classmethod
    def from_model(cls, model, dtype: torch.dtype | None = None) -> DecoderWeights | None:
        """Fused weights of `model` in `dtype` (default: `decode_dtype`, the caller's autocast
        dtype, else the model's), or None when the model is not a supported architecture. A peft LoRA model is decoded with its adapters
        folded in (W + scale B A, computed here, the model untouched)."""
        if hasattr(model, "peft_config"):
            model = model.get_base_model()
        if not _supported(model):
            return None
        cfg, inner = model.config, model.model
        dtype = dtype or decode_dtype(model)
        layers = tuple(_layer_weights(layer, dtype) for layer in inner.layers)
        attn = inner.layers[0].self_attn
        return cls(layers=layers, embed=inner.embed_tokens.weight.detach().to(dtype),
                   final_norm=RMSNormWeights.of(inner.norm, dtype),
                   lm_head=Projection(model.lm_head.weight.detach().to(dtype), None),
                   rotary=inner.rotary_emb,
                   heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
                   head_dim=attn.head_dim, intermediate=layers[0].down.shape[1],
                   scaling=attn.scaling, dtype=dtype)


def decode_dtype(model) -> torch.dtype:
    """The dtype the caller's autocast (train.compute_dtype) computes in, else the model's:
    the dtype the decode weights are cast to."""
    device = next(model.parameters()).device
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


class DecodeWeightsCache:
    """The fused decode weights of one model, built once per weight version rather than at
    every `generate` call (a 0.5 B model's are ~1 GB of fresh bf16, and with LoRA every
    delta weight computed again). The version is the caller's word (the trainer's policy
    version): the key also holds every parameter's address, so weights replaced by new
    tensors (a weight sync's `.data =`) rebuild it, but weights changed in place (an
    optimiser step) need a new version."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._weights: DecoderWeights | None = None
        self.builds = 0

    def get(self, model, version: int) -> DecoderWeights | None:
        """The weights for `model` at `version`, in `decode_dtype(model)`."""
        dtype = decode_dtype(model)
        key = (version, dtype, tuple(p.data_ptr() for p in model.parameters()))
        if key != self._key:
            self._weights, self._key = None, None  # the old copy is freed before the new
            self._weights, self._key = DecoderWeights.from_model(model, dtype), key
            self.builds += 1
        return self._weights


def _supported(model) -> bool:
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(cfg, "hidden_act", None) != "silu":
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    if any(kind != "full_attention" for kind in getattr(cfg, "layer_types", None) or ()):
        return False
    inner = getattr(model, "model", None)
    lm_head = getattr(model, "lm_head", None)
    if inner is None or type(lm_head) is not nn.Linear or lm_head.bias is not None:
        return False
    if type(inner.embed_tokens) is not nn.Embedding:
        return False
    for layer in inner.layers:
        a, m = layer.self_attn, layer.mlp
        linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        if any(_linear(x) is None for x in linears):
            return False
        norms = (layer.input_layernorm, layer.post_attention_layernorm,
                 getattr(a, "q_norm", None), getattr(a, "k_norm", None))
        if not all(n is None or hasattr(n, "variance_epsilon") for n in norms):
            return False
    return hasattr(inner.norm, "variance_epsilon")


def _linear(module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) that `module` applies: an `nn.Linear`'s own, or a peft LoRA layer's
    base weight plus each active adapter's delta; None for anything else (DoRA and other
    variants, adapter biases, a merged layer with its adapters disabled)."""
    if type(module) is nn.Linear:
        return module.weight.detach(), _detach(module.bias)
    base = getattr(module, "base_layer", None)
    if type(base) is not nn.Linear or not hasattr(module, "get_delta_weight"):
        return None
    if module.disable_adapters:
        return None if module.merged else (base.weight.detach(), _detach(base.bias))
    weight = base.weight.detach()
    if module.merged:
        return weight, _detach(base.bias)
    for adapter in module.active_adapters:
        if adapter not in module.lora_A:
            continue
        if adapter in module.lora_variant or module.lora_bias.get(adapter, False):
            return None
        weight = weight + module.get_delta_weight(adapter).detach()
    return weight, _detach(base.bias)


def _detach(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _cat(*tensors: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if any(t is None for t in tensors):
        return None
    return torch.cat(tensors).to(dtype)


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


def _layer_weights(layer, dtype: torch.dtype) -> LayerWeights:
    a, m = layer.self_attn, layer.mlp
    (q, q_bias), (k, k_bias), (v, v_bias) = (_linear(a.q_proj), _linear(a.k_proj),
                                             _linear(a.v_proj))
    (gate, gate_bias), (up, up_bias) = _linear(m.gate_proj), _linear(m.up_proj)
    out, out_bias = _linear(a.o_proj)
    down, down_bias = _linear(m.down_proj)
    return LayerWeights(
        qkv=Projection(_cat(q, k, v, dtype=dtype), _cat(q_bias, k_bias, v_bias, dtype=dtype)),
        out=Projection(_cast(out, dtype), _cast(out_bias, dtype)),
        gate_up=Projection(_cat(gate, up, dtype=dtype), _cat(gate_bias, up_bias, dtype=dtype)),
        down=Projection(_cast(down, dtype), _cast(down_bias, dtype)),
        attn_norm=RMSNormWeights.of(layer.input_layernorm, dtype),
        mlp_norm=RMSNormWeights.of(layer.post_attention_layernorm, dtype),
        q_norm=RMSNormWeights.of(getattr(a, "q_norm", None), dtype),
        k_norm=RMSNormWeights.of(getattr(a, "k_norm", None), dtype))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
            scaling: float) -> torch.Tensor:
    """Grouped-query attention of one new token per row without repeating keys: the group's
    queries are rows, `[B, Hk, group, d]` against the cache window's `[B, Hk, T, d]`.

    fp32: two matmuls and a softmax. Other dtypes: SDPA, which reads the window where it
    lies: a bf16 matmul on the strided window copies it first, and at 32 rows x 200 columns
    of the 31.5 M model's shape the matmul path took 1.86 ms per layer against SDPA's 0.80
    (2 threads, AMX Xeon). fp32 keeps the matmuls: as fast there (0.65 ms both), and the
    sampled tokens of fp32 runs stay those of earlier releases."""
    if q.dtype != torch.float32:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=scaling)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scaling + bias
    return torch.matmul(scores.softmax(-1), values)


def decode_step(weights: DecoderWeights, cache: KVCache, tokens: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
    """Feed one token per row (`tokens`, `positions`: [B]); return the next-token logits
    [B, V] in float32. The tokens' keys and values go into a new column of `cache`, and
    attention reads its live window `[start, end)`."""
    column = cache.append_column()

    def write(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cache.keys[i, :, :, column] = k
        cache.values[i, :, :, column] = v
        return cache.layer_window(i)

    return _decode(weights, tokens, positions, write, cache.bias[..., cache.start:cache.end])


def static_decode_step(weights: DecoderWeights, cache: KVCache, tokens: torch.Tensor,
                       positions: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """`decode_step` at shapes that do not change from one token to the next, for a captured
    CUDA graph (rollout/graphs.py): the first `b = len(tokens)` rows of `cache`, attention over
    all its columns (those not yet written are masked), the column to write a tensor
    (`column`, [1] long, advanced by one here) rather than a Python int, no allocation that
    depends on the step. The cache is never reallocated: it must have room for every step."""
    rows = tokens.shape[0]
    cache.bias[:rows].index_fill_(3, column, 0.0)

    def write(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = cache.keys[i, :rows], cache.values[i, :rows]
        keys.index_copy_(2, column, k[:, :, None])
        values.index_copy_(2, column, v[:, :, None])
        return keys, values

    logits = _decode(weights, tokens, positions, write, cache.bias[:rows])
    column.add_(1)
    return logits


def _decode(w: DecoderWeights, tokens: torch.Tensor, positions: torch.Tensor, write,
            bias: torch.Tensor) -> torch.Tensor:
    """The decoder's math for one token per row: `write(layer, k, v)` stores the new keys
    and values ([B, Hk, d]) and returns the layer's keys and values to attend to ([B, Hk, T,
    d]), `bias` [B, 1, 1, T] masks them."""
    batch = tokens.shape[0]
    q_dim, kv_dim = w.heads * w.head_dim, w.kv_heads * w.head_dim
    group = w.heads // w.kv_heads
    x = F.embedding(tokens, w.embed)                                   # [B, D]
    cos, sin = w.rotary(x[:, None], positions[:, None])                # [B, 1, d]
    cos, sin = cos.to(w.dtype), sin.to(w.dtype)
    for i, layer in enumerate(w.layers):
        qkv = layer.qkv(rms_norm(x, layer.attn_norm))
        v = qkv[:, q_dim + kv_dim:].view(batch, w.kv_heads, w.head_dim)
        if layer.q_norm is None:  # the queries' and keys' heads rotated in one go
            qk = qkv[:, :q_dim + kv_dim].view(batch, w.heads + w.kv_heads, w.head_dim)
            qk = qk * cos + _rotate_half(qk) * sin
            q, k = qk[:, :w.heads], qk[:, w.heads:]
        else:
            q = rms_norm(qkv[:, :q_dim].view(batch, w.heads, w.head_dim), layer.q_norm)
            k = rms_norm(qkv[:, q_dim:q_dim + kv_dim].view(batch, w.kv_heads, w.head_dim),
                         layer.k_norm)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        keys, values = write(i, k, v)
        attn = _attend(q.view(batch, w.kv_heads, group, w.head_dim), keys, values, bias,
                       w.scaling).reshape(batch, q_dim)
        x = x + layer.out(attn)
        gate_up = layer.gate_up(rms_norm(x, layer.mlp_norm))
        hidden = F.silu(gate_up[:, : w.intermediate]) * gate_up[:, w.intermediate:]
        x = x + layer.down(hidden)
    return w.lm_head(rms_norm(x, w.final_norm)).float()
