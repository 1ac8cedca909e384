"""Batched generation with a KV cache, temperature and top-p.

Written over the model's forward rather than `model.generate` because the loop needs the
sampler's own log-probabilities of the tokens it drew (the behaviour policy `mu` for
importance-sampling corrections): the log-prob under the distribution actually sampled
from, after temperature and top-p truncation, so that pi_old/mu shows the truncation.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache

from .decoder import SUPPORTED_MODEL_TYPES, DecoderWeights, decode_step
from .graphs import BucketedDecodeStep
from .kv_cache import KVCache
from .sampling import CDF_MIN_VOCAB, device_generator, sample_by_cdf, sample_next, sample_tokens

__all__ = ["CDF_MIN_VOCAB", "Rollout", "SamplingParams", "generate", "sample_by_cdf",
           "sample_next", "sample_tokens", "step_function"]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class Rollout:
    """Completions of one batch of prompts, right-padded to the longest completion."""

    prompt_ids: list[list[int]]
    completion_ids: torch.Tensor     # [B, T] long, pad after the end
    sampler_logprobs: torch.Tensor   # [B, T] float32, 0 on padding
    mask: torch.Tensor               # [B, T] float32, 1 on completion tokens (EOS included)
    lengths: torch.Tensor            # [B] long, completion tokens incl. EOS if emitted
    finish_reasons: list[str]        # "stop" (EOS) or "length"
    policy_version: int              # the oldest version that drew any token
    token_versions: torch.Tensor | None = None  # [B, T] long; None: all `policy_version`
    # [B, T] float32, 1 on tokens a tool wrote (results inside the completion: context, never
    # sampled); None: no tool tokens.
    tool_mask: torch.Tensor | None = None

    def versions(self) -> torch.Tensor:
        """[B, T] policy version of every token (padding included, masked by `mask`)."""
        if self.token_versions is not None:
            return self.token_versions
        return torch.full(self.completion_ids.shape, self.policy_version, dtype=torch.long)

    def tools(self) -> torch.Tensor:
        """[B, T] 1 on tool-written tokens, 0 elsewhere."""
        if self.tool_mask is not None:
            return self.tool_mask
        return torch.zeros(self.completion_ids.shape, dtype=torch.float32)

    def tool_calls(self) -> torch.Tensor:
        """[B] the tool calls of each row: one run of tool-written tokens per call's result
        (results are separated by the model's own call tags)."""
        written = self.tools() > 0
        starts = written[:, 1:] & ~written[:, :-1]
        return written[:, 0].long() + starts.sum(1)

    def sampled_mask(self) -> torch.Tensor:
        """[B, T] 1 on the tokens the policy sampled: what the loss, KL and entropy see."""
        return self.mask if self.tool_mask is None else self.mask * (1 - self.tool_mask)


# transformers 5.20 renamed the KV-cache argument and output `past_key_values` -> `cache`;
# vLLM 0.32 pins transformers < 5.20, so both spellings are in use.
_CACHE_NAME = ("cache" if Version(transformers.__version__) >= Version("5.20")
               else "past_key_values")


@functools.cache
def _keeps_last_logits(forward_owner: type) -> bool:
    """Whether a model class's forward takes `logits_to_keep` (transformers' causal LMs)."""
    return "logits_to_keep" in inspect.signature(forward_owner.forward).parameters


def cached_forward(model, cache, **inputs) -> tuple[torch.Tensor, Any]:
    """(`[B, V]` logits of each row's last position, updated cache) of one forward that
    extends `cache` (None: a new one). Where the model allows it, the output layer runs on
    the last position alone: a prefill of 400 prompts of 40 tokens would otherwise project
    16,000 positions onto a 49k vocabulary (3 GB of float32 logits) to read 400 of them."""
    owner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    keep = {"logits_to_keep": 1} if _keeps_last_logits(type(owner)) else {}
    out = model(**inputs, **{_CACHE_NAME: cache}, use_cache=True, **keep)
    return out.logits[:, -1, :], out[_CACHE_NAME]


def shared_prefills(prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(first, index)`: the first row of each distinct prompt, and for every row which of
    those it repeats. A GRPO batch holds each prompt G times: one prefill serves all G."""
    first: list[int] = []
    seen: dict[tuple[int, ...], int] = {}
    index = [seen.setdefault(tuple(ids), len(seen)) for ids in prompt_ids]
    for row, which in enumerate(index):
        if which == len(first):
            first.append(row)
    return torch.tensor(first), torch.tensor(index)


# How often, in token steps, the decode loop asks whether every row has finished and
# compacts the finished rows out: a host synchronisation on a GPU, free on a CPU. Every step
# on a CPU keeps the token streams of earlier releases (rows compact at the same steps); a
# GPU asks every EOS_CHECK_EVERY_GPU steps (benchmarks/gpu_check.sh measures the choice).
EOS_CHECK_EVERY_GPU = 8


def left_padded(prompt_ids: list[list[int]], pad_token_id: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, positions), each [B, P]: every prompt ends at column P."""
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, ids in enumerate(prompt_ids):
        input_ids[i, width - len(ids):] = torch.tensor(ids)
        attention[i, width - len(ids):] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    return input_ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(model, prompt_ids: list[list[int]], params: SamplingParams, *, eos_token_id: int,
             pad_token_id: int, generator: torch.Generator | None = None,
             policy_version: int = 0, fast_decode: bool = True,
             decode_weights: DecoderWeights | None = None,
             eos_check_every: int | None = None, static_step: bool = False) -> Rollout:
    """Sample completions of `prompt_ids` (one batch, left-padded). The prefill is the
    model's forward, once per distinct prompt (its keys and values copied to every row
    that repeats it); the decode steps run `decoder.decode_step` where the architecture is
    supported (`fast_decode`; over `decode_weights` when the caller built them for the
    model's current weights, `DecodeWeightsCache`), else the model's forward; both over one
    preallocated `KVCache`. Rows that finish leave the batch, so the later steps compute
    only the running ones.

    Tokens, log-probs and the finished rows stay on the model's device, drawn from a
    generator there (`sampling.device_generator`): inside a token step nothing waits for
    the host, which asks whether every row is done every `eos_check_every` steps (default:
    1 on a CPU, EOS_CHECK_EVERY_GPU elsewhere); a row's draws after its EOS are discarded.
    `static_step` runs the decoder's static-shape step on the running rows' bucket
    (rollout/graphs.py): a CUDA graph per bucket on a GPU, eager on a CPU; it needs a model
    the decoder supports."""
    batch, budget = len(prompt_ids), params.max_new_tokens
    device = next(model.parameters()).device
    every = eos_check_every or (1 if device.type == "cpu" else EOS_CHECK_EVERY_GPU)
    input_ids, attention, positions = left_padded(prompt_ids, pad_token_id, device)
    first, repeats = (x.to(device) for x in shared_prefills(prompt_ids))
    logits, hf_cache = cached_forward(model, None, input_ids=input_ids[first],
                                      attention_mask=attention[first],
                                      position_ids=positions[first])
    next_logits = logits.float()[repeats]
    if not fast_decode:
        decode_weights = None
    elif decode_weights is None:
        decode_weights = DecoderWeights.from_model(model)
    cache = KVCache.from_prefill(hf_cache, attention[first], input_ids.shape[1] + budget,
                                 decode_weights.dtype if decode_weights else None)
    del hf_cache
    if len(first) < batch:
        cache.keep_rows(repeats)
    step, keep_rows = _stepper(model, decode_weights, cache, static_step)

    draw = device_generator(generator, device)
    tokens = torch.full((batch, budget), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, budget), dtype=torch.float32, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)  # the batch rows still running, in cache order
    next_positions = positions[:, -1] + 1
    for t in range(budget):
        chosen, chosen_logp = sample_tokens(next_logits, params.temperature, params.top_p, draw)
        alive = ~finished[rows]  # rows that finished since the last compaction draw nothing
        tokens[rows, t] = torch.where(alive, chosen, pad_token_id)
        logprobs[rows, t] = torch.where(alive, chosen_logp, 0.0)
        lengths[rows] += alive.long()
        finished[rows] |= alive & (chosen == eos_token_id)
        if t == budget - 1:
            break
        if (t + 1) % every == 0:  # the one host sync of a check (rows left out are done)
            running = ~finished[rows]
            left = int(running.sum())
            if left == 0:
                break
            if left <= 3 * len(rows) // 4:  # compact once a quarter is done
                kept = running.nonzero().squeeze(-1)
                rows, chosen, next_positions = rows[kept], chosen[kept], next_positions[kept]
                keep_rows(kept)
        next_logits = step(cache, chosen, next_positions)
        next_positions = next_positions + 1
    return _rollout(prompt_ids, tokens, logprobs, lengths, finished, policy_version)


def _rollout(prompt_ids: list[list[int]], tokens: torch.Tensor, logprobs: torch.Tensor,
             lengths: torch.Tensor, finished: torch.Tensor, policy_version: int) -> Rollout:
    """The `Rollout` of a decode loop's device tensors, cut to the longest completion."""
    lengths, finished = lengths.cpu(), finished.cpu()
    width = max(int(lengths.max()), 1)
    tokens, logprobs = tokens[:, :width].cpu(), logprobs[:, :width].cpu()
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    reasons = ["stop" if f else "length" for f in finished.tolist()]
    return Rollout(prompt_ids=[list(p) for p in prompt_ids], completion_ids=tokens,
                   sampler_logprobs=logprobs * mask, mask=mask, lengths=lengths,
                   finish_reasons=reasons, policy_version=policy_version)


def _stepper(model, weights: DecoderWeights | None, cache: KVCache, static: bool):
    """(a step (cache, tokens, positions) -> logits, how to keep only some rows of the
    cache) for `generate`: the static step per bucket over a cache compacted in place, the
    fused decode step over a shrinking cache, or the model's own forward."""
    if static:
        if weights is None:
            raise ValueError("static_step needs a model the fused decoder supports "
                             f"({', '.join(SUPPORTED_MODEL_TYPES)}) and fast_decode")
        return BucketedDecodeStep(weights, cache), cache.compact_rows
    return _step(model, weights, cache.keys.device), cache.keep_rows


def forward_step(model, cache: KVCache, tokens: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    """`decoder.decode_step` through the model's own forward, for the models the decoder
    does not support: the cache's window is handed to the model as a `DynamicCache`, and
    the new column copied back."""
    window = DynamicCache()
    for i in range(cache.keys.shape[0]):
        window.update(*cache.layer_window(i), i)
    column = cache.append_column()
    logits, window = cached_forward(model, window, input_ids=tokens[:, None],
                                    attention_mask=cache.attention_mask(),
                                    position_ids=positions[:, None])
    for i, layer in enumerate(window.layers):
        cache.keys[i, :, :, column] = layer.keys[:, :, -1]
        cache.values[i, :, :, column] = layer.values[:, :, -1]
    return logits.float()


def step_function(model, fast_decode: bool = True):
    """(the KV cache dtype, a step (cache, tokens [b], positions [b]) -> next-token logits
    [b, V] float32): `decoder.decode_step` over weights fused now where the architecture is
    supported (so call again after the weights change), else the model's forward."""
    device = next(model.parameters()).device
    weights = DecoderWeights.from_model(model) if fast_decode else None
    return (weights.dtype if weights else None), _step(model, weights, device)


def _step(model, weights: DecoderWeights | None, device: torch.device):
    if weights is None:
        return functools.partial(forward_step, model)

    def fast(cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, enabled=False):  # the weights are cast already
            return decode_step(weights, cache, tokens, positions)

    return fast


def decode_completions(tokenizer, rollout: Rollout) -> list[str]:
    texts = []
    for row, n, reason in zip(rollout.completion_ids.tolist(), rollout.lengths.tolist(),
                              rollout.finish_reasons, strict=True):
        ids = row[: n - 1] if reason == "stop" else row[:n]  # drop the EOS token
        texts.append(tokenizer.decode(ids, skip_special_tokens=False))
    return texts
