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

from .decoder import DecoderWeights, decode_step
from .kv_cache import KVCache


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


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    # Drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token).
    drop = probs.cumsum(-1) - probs >= top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


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


# Vocabularies of at least this many tokens draw by inverse CDF (`sample_by_cdf`); smaller
# ones keep torch.multinomial, whose cost there is small (~0.5 ms for 64 rows of 100 tokens)
# and whose streams every documented run of the character-vocabulary models was drawn from.
# multinomial draws one exponential per vocabulary entry: 105 ms for 32 rows of Qwen2's
# 151,936 tokens on 2 threads, about a sixth of a 0.5 B model's decode step there.
CDF_MIN_VOCAB = 1024
CDF_BLOCK = 256


def sample_by_cdf(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of `probs` [B, V] (unnormalised, >= 0, each row's sum > 0), drawn
    with probability proportional to its entry, from one uniform per row: the inverse CDF in
    two levels, blocks of CDF_BLOCK entries and then the entries of the chosen block, each in
    float64 (one flat float32 cumsum over 10^5 entries would drift by more than a rare
    token's probability). Entries of 0 are never drawn.

    It runs where `probs` lies; the uniforms come from `generator` (the CPU's default when
    None) and move there, so a seed draws the same tokens on every device up to float64
    rounding. No copy of `probs` is made: the blocks are views, the last one partial."""
    rows, vocab = probs.shape
    full = vocab // CDF_BLOCK
    sums = [probs[:, :full * CDF_BLOCK].reshape(rows, full, CDF_BLOCK).sum(-1, dtype=torch.float64)]
    if vocab > full * CDF_BLOCK:
        sums.append(probs[:, full * CDF_BLOCK:].sum(-1, keepdim=True, dtype=torch.float64))
    cdf = torch.cat(sums, -1).cumsum(-1)                                        # [B, blocks]
    blocks = cdf.shape[-1]
    total = cdf[:, -1:]
    u = torch.rand(rows, 1, generator=generator, dtype=torch.float64,
                   device=generator.device if generator is not None else "cpu")
    u = u.to(probs.device) * total
    u = torch.minimum(u, total * (1 - 2.0 ** -40))                              # u < total
    block = torch.searchsorted(cdf, u, right=True).clamp_(max=blocks - 1)       # [B, 1]
    below = torch.where(block > 0, cdf.gather(-1, (block - 1).clamp(min=0)), 0.0)
    columns = block * CDF_BLOCK + torch.arange(CDF_BLOCK, device=probs.device)  # [B, BLOCK]
    inner = probs.gather(1, columns.clamp(max=vocab - 1)).to(torch.float64)
    inner = inner.masked_fill_(columns >= vocab, 0.0).cumsum(-1)               # [B, BLOCK]
    rest = torch.minimum(u - below, inner[:, -1:] * (1 - 2.0 ** -40)).clamp(min=0)
    within = torch.searchsorted(inner, rest, right=True).clamp_(max=CDF_BLOCK - 1)
    return (block * CDF_BLOCK + within).squeeze(-1)


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of `[B, V]` logits; return the tokens and their log-probs under
    the distribution they were drawn from (temperature-scaled, top-p-truncated, renormalised;
    greedy decoding is a point mass: log-prob 0). Both returned on the CPU.

    A large vocabulary is drawn where the logits lie (`sample_by_cdf`), and only the [B]
    tokens and log-probs come back: on an H200 a 0.5 B model's 32 x 151,936 log-probs took
    7.5 ms a token step to copy to the host and ~23 ms more to draw there, beside an 18.6 ms
    decode step. A small one moves to the CPU and keeps `torch.multinomial`'s stream."""
    if temperature <= 0:
        chosen = logits.argmax(-1).cpu()
        return chosen, torch.zeros(chosen.shape, dtype=torch.float32)
    logp = _top_p_filter(logits.float() / temperature, top_p).log_softmax(-1)
    if logp.shape[-1] >= CDF_MIN_VOCAB:
        chosen = sample_by_cdf(logp.exp(), generator)
        return chosen.cpu(), logp.gather(-1, chosen[:, None]).squeeze(-1).cpu()
    logp = logp.cpu()
    chosen = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1)


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


@torch.no_grad()
def generate(model, prompt_ids: list[list[int]], params: SamplingParams, *, eos_token_id: int,
             pad_token_id: int, generator: torch.Generator | None = None,
             policy_version: int = 0, fast_decode: bool = True) -> Rollout:
    """Sample completions of `prompt_ids` (one batch, left-padded). The prefill is the
    model's forward, once per distinct prompt (its keys and values copied to every row
    that repeats it); the decode steps run `decoder.decode_step` where the architecture is
    supported (`fast_decode`), else the model's forward; both over one preallocated
    `KVCache`. Rows that finish leave the batch, so the later steps compute only the
    running ones."""
    batch = len(prompt_ids)
    width = max(len(p) for p in prompt_ids)
    device = next(model.parameters()).device
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    for i, ids in enumerate(prompt_ids):  # left padding: every prompt ends at the same column
        input_ids[i, width - len(ids):] = torch.tensor(ids)
        attention[i, width - len(ids):] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)

    tokens = torch.full((batch, params.max_new_tokens), pad_token_id, dtype=torch.long)
    logprobs = torch.zeros((batch, params.max_new_tokens), dtype=torch.float32)
    finished = torch.zeros(batch, dtype=torch.bool)
    lengths = torch.zeros(batch, dtype=torch.long)

    first, repeats = shared_prefills(prompt_ids)
    first, repeats = first.to(device), repeats.to(device)
    logits, hf_cache = cached_forward(model, None, input_ids=input_ids[first],
                                      attention_mask=attention[first],
                                      position_ids=positions[first])
    next_logits = logits.float()[repeats]
    cache_dtype, step = step_function(model, fast_decode)
    cache = KVCache.from_prefill(hf_cache, attention[first], width + params.max_new_tokens,
                                 cache_dtype)
    del hf_cache
    if len(first) < batch:
        cache.keep_rows(repeats)
    rows = torch.arange(batch)        # the batch rows still running, in the cache's order
    next_positions = positions[:, -1] + 1
    for t in range(params.max_new_tokens):
        chosen, chosen_logp = sample_next(next_logits, params.temperature, params.top_p,
                                          generator)
        drawn = ~finished[rows]  # rows that finished since the last compaction draw nothing
        live = rows[drawn]
        tokens[live, t] = chosen[drawn]
        logprobs[live, t] = chosen_logp[drawn]
        lengths[live] += 1
        finished[live] |= chosen[drawn] == eos_token_id
        if bool(finished.all()) or t == params.max_new_tokens - 1:
            break
        running = ~finished[rows]
        if int(running.sum()) <= 3 * len(rows) // 4:  # compact once a quarter has finished
            keep = running.nonzero().squeeze(-1)
            rows, chosen, next_positions = rows[keep], chosen[keep], next_positions[keep]
            cache.keep_rows(keep.to(device))
        next_logits = step(cache, chosen.to(device), next_positions)
        next_positions = next_positions + 1

    width_out = max(int(lengths.max()), 1)
    tokens, logprobs = tokens[:, :width_out], logprobs[:, :width_out]
    mask = (torch.arange(width_out)[None, :] < lengths[:, None]).float()
    reasons = ["stop" if f else "length" for f in finished.tolist()]
    return Rollout(prompt_ids=[list(p) for p in prompt_ids], completion_ids=tokens,
                   sampler_logprobs=logprobs * mask, mask=mask, lengths=lengths,
                   finish_reasons=reasons, policy_version=policy_version)


def _compute_dtype(model, device: torch.device) -> torch.dtype:
    """The dtype the caller's autocast (train.compute_dtype) computes in, else the model's."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


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
    weights = DecoderWeights.from_model(model, _compute_dtype(model, device)) if fast_decode \
        else None
    if weights is None:
        return None, functools.partial(forward_step, model)

    def fast(cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, enabled=False):  # the weights are cast already
            return decode_step(weights, cache, tokens, positions)

    return weights.dtype, fast


def decode_completions(tokenizer, rollout: Rollout) -> list[str]:
    texts = []
    for row, n, reason in zip(rollout.completion_ids.tolist(), rollout.lengths.tolist(),
                              rollout.finish_reasons, strict=True):
        ids = row[: n - 1] if reason == "stop" else row[:n]  # drop the EOS token
        texts.append(tokenizer.decode(ids, skip_special_tokens=False))
    return texts
