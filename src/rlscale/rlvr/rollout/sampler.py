"""Batched generation with a KV cache, temperature and top-p.

Written over the model's forward rather than `model.generate` because the loop needs the
sampler's own log-probabilities of the tokens it drew (the behaviour policy `mu` for
importance-sampling corrections): the log-prob under the distribution actually sampled
from, after temperature and top-p truncation, so that pi_old/mu shows the truncation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from packaging.version import Version

from .decoder import DecoderWeights, StaticKVCache, decode_step


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

    def versions(self) -> torch.Tensor:
        """[B, T] policy version of every token (padding included, masked by `mask`)."""
        if self.token_versions is not None:
            return self.token_versions
        return torch.full(self.completion_ids.shape, self.policy_version, dtype=torch.long)


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


def cached_forward(model, cache, **inputs) -> tuple[torch.Tensor, Any]:
    """(logits, updated cache) of one forward that extends `cache` (None: a new one)."""
    out = model(**inputs, **{_CACHE_NAME: cache}, use_cache=True)
    return out.logits, out[_CACHE_NAME]


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of `[B, V]` logits; return the tokens and their log-probs under
    the distribution they were drawn from (temperature-scaled, top-p-truncated, renormalised;
    greedy decoding is a point mass: log-prob 0). Both on the CPU."""
    if temperature <= 0:
        chosen = logits.argmax(-1).cpu()
        return chosen, torch.zeros(chosen.shape, dtype=torch.float32)
    logp = _top_p_filter(logits.float() / temperature, top_p).log_softmax(-1).cpu()
    chosen = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1)


@torch.no_grad()
def generate(model, prompt_ids: list[list[int]], params: SamplingParams, *, eos_token_id: int,
             pad_token_id: int, generator: torch.Generator | None = None,
             policy_version: int = 0, fast_decode: bool = True) -> Rollout:
    """Sample completions of `prompt_ids` (one batch, left-padded). The prefill is the
    model's forward; the decode steps run `decoder.decode_step` where the architecture is
    supported (`fast_decode`), else the model's forward with its own cache. Rows that finish
    leave the batch, so the later steps compute only the running ones."""
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

    logits, hf_cache = cached_forward(model, None, input_ids=input_ids,
                                      attention_mask=attention, position_ids=positions)
    next_logits = logits[:, -1, :].float()
    step_fn = _decode_steps(model, hf_cache, attention, width + params.max_new_tokens,
                            fast_decode)
    rows = torch.arange(batch)        # the batch rows still running, in the cache's order
    next_positions = positions[:, -1] + 1
    for step in range(params.max_new_tokens):
        chosen, chosen_logp = sample_next(next_logits, params.temperature, params.top_p,
                                          generator)
        live = rows[~finished[rows]]  # rows that finished since the last compaction idle
        drawn = ~finished[rows]
        tokens[live, step] = chosen[drawn]
        logprobs[live, step] = chosen_logp[drawn]
        lengths[live] += 1
        finished[live] |= chosen[drawn] == eos_token_id
        if bool(finished.all()) or step == params.max_new_tokens - 1:
            break
        running = ~finished[rows]
        keep = None
        if int(running.sum()) <= 3 * len(rows) // 4:  # compact once a quarter has finished
            keep = running.nonzero().squeeze(-1)
            rows, chosen, next_positions = rows[keep], chosen[keep], next_positions[keep]
        next_logits = step_fn(chosen.to(device), next_positions, keep)
        next_positions = next_positions + 1

    width_out = max(int(lengths.max()), 1)
    tokens, logprobs = tokens[:, :width_out], logprobs[:, :width_out]
    mask = (torch.arange(width_out)[None, :] < lengths[:, None]).float()
    tokens = tokens.masked_fill(mask == 0, pad_token_id)
    reasons = ["stop" if f else "length" for f in finished.tolist()]
    return Rollout(prompt_ids=[list(p) for p in prompt_ids], completion_ids=tokens,
                   sampler_logprobs=logprobs * mask, mask=mask, lengths=lengths,
                   finish_reasons=reasons, policy_version=policy_version)


def _compute_dtype(model, device: torch.device) -> torch.dtype:
    """The dtype the caller's autocast (train.compute_dtype) computes in, else the model's."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


def _decode_steps(model, hf_cache, attention: torch.Tensor, width: int, fast_decode: bool):
    """A function (tokens [b], positions [b], keep [b] or None) -> next logits [b, V] in
    float32 that feeds one token per running row; `keep` first drops finished rows."""
    device = attention.device
    weights = DecoderWeights.from_model(model, _compute_dtype(model, device)) if fast_decode \
        else None
    if weights is not None:
        cache = StaticKVCache(weights, attention.shape[0], width, device)
        cache.load_prefill(hf_cache, attention)
        del hf_cache

        def fast(tokens, positions, keep):
            if keep is not None:
                cache.keep_rows(keep.to(device))
            with torch.autocast(device.type, enabled=False):  # the weights are cast already
                return decode_step(weights, cache, tokens, positions.to(device))

        return fast
    state = {"cache": hf_cache, "attention": attention}

    def slow(tokens, positions, keep):
        if keep is not None:
            state["cache"].batch_select_indices(keep.to(device))
            state["attention"] = state["attention"][keep.to(device)]
        state["attention"] = F.pad(state["attention"], (0, 1), value=1)
        logits, state["cache"] = cached_forward(
            model, state["cache"], input_ids=tokens[:, None],
            attention_mask=state["attention"], position_ids=positions[:, None].to(device))
        return logits[:, -1, :].float()

    return slow


def decode_completions(tokenizer, rollout: Rollout) -> list[str]:
    texts = []
    for row, n, reason in zip(rollout.completion_ids.tolist(), rollout.lengths.tolist(),
                              rollout.finish_reasons, strict=True):
        ids = row[: n - 1] if reason == "stop" else row[:n]  # drop the EOS token
        texts.append(tokenizer.decode(ids, skip_special_tokens=False))
    return texts
