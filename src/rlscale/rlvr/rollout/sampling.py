"""Drawing the next token: temperature, top-p, and the log-prob of what was drawn, on the
device the logits lie on, from a seeded generator there.

The log-prob is that of the distribution actually sampled from (temperature-scaled,
top-p-truncated, renormalised), the behaviour policy `mu` of the loop's importance-sampling
corrections. A decode loop that keeps its tokens on the device (`sampler.generate`) never
waits for the host inside a token step; `sample_next` is the host-side form the engine uses.
"""

from __future__ import annotations

import torch

# Vocabularies of at least this many tokens draw by inverse CDF (`sample_by_cdf`); smaller
# ones keep torch.multinomial, whose cost there is small (~0.5 ms for 64 rows of 100 tokens)
# and whose streams every documented run of the character-vocabulary models was drawn from.
# multinomial draws one exponential per vocabulary entry: 105 ms for 32 rows of Qwen2's
# 151,936 tokens on 2 threads, about a sixth of a 0.5 B model's decode step there.
CDF_MIN_VOCAB = 1024
CDF_BLOCK = 256


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    # Drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token).
    drop = probs.cumsum(-1) - probs >= top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample_by_cdf(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of `probs` [B, V] (unnormalised, >= 0, each row's sum > 0), drawn
    with probability proportional to its entry, from one uniform per row: the inverse CDF in
    two levels, blocks of CDF_BLOCK entries and then the entries of the chosen block, each in
    float64 (one flat float32 cumsum over 10^5 entries would drift by more than a rare
    token's probability). Entries of 0 are never drawn.

    It runs where `probs` lies; the uniforms come from `generator` (the default generator of
    `probs`' device when None) and move there if it lies elsewhere, so a CPU generator draws
    the same tokens on every device up to float64 rounding. No copy of `probs` is made: the
    blocks are views, the last one partial."""
    rows, vocab = probs.shape
    full = vocab // CDF_BLOCK
    sums = [probs[:, :full * CDF_BLOCK].reshape(rows, full, CDF_BLOCK).sum(-1, dtype=torch.float64)]
    if vocab > full * CDF_BLOCK:
        sums.append(probs[:, full * CDF_BLOCK:].sum(-1, keepdim=True, dtype=torch.float64))
    cdf = torch.cat(sums, -1).cumsum(-1)                                        # [B, blocks]
    blocks = cdf.shape[-1]
    total = cdf[:, -1:]
    u = torch.rand(rows, 1, generator=generator, dtype=torch.float64,
                   device=generator.device if generator is not None else probs.device)
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


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of `[B, V]` logits; return the tokens (long) and their
    log-probs (float32) under the distribution they were drawn from (greedy decoding is a
    point mass: log-prob 0), both on the logits' device.

    A large vocabulary is drawn by inverse CDF, a small one by `torch.multinomial`, each
    where `generator` lies (with no generator, where the logits lie): a generator on the
    logits' device (`device_generator`) draws without a transfer; a CPU generator with
    device logits keeps the CPU's stream at the cost of moving a small vocabulary's
    log-probs to the host."""
    if temperature <= 0:
        chosen = logits.argmax(-1)
        return chosen, torch.zeros(chosen.shape, dtype=torch.float32, device=chosen.device)
    logp = top_p_filter(logits.float() / temperature, top_p).log_softmax(-1)
    if logp.shape[-1] >= CDF_MIN_VOCAB:
        chosen = sample_by_cdf(logp.exp(), generator)
        return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1)
    drawn_on = generator.device if generator is not None else logp.device
    chosen = torch.multinomial(logp.to(drawn_on).exp(), 1, generator=generator).squeeze(-1)
    chosen = chosen.to(logp.device)
    return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1)


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_tokens` with the tokens and log-probs returned on the CPU (the engine's rows
    are host-side records). Only the [B] tokens and log-probs cross: on an H200 a 0.5 B
    model's 32 x 151,936 log-probs took 7.5 ms a token step to copy to the host."""
    chosen, logp = sample_tokens(logits, temperature, top_p, generator)
    return chosen.cpu(), logp.cpu()


def device_generator(generator: torch.Generator | None,
                     device: torch.device) -> torch.Generator | None:
    """A generator on `device` that a seeded `generator` decides: itself where it lies there
    already (the CPU: the stream unchanged), else a new one on `device` seeded by one draw
    from it, so a run stays reproducible from its seed without a host round trip per token.
    The tokens differ from the CPU stream's (another generator), with the same
    distribution (tests/test_sampling.py)."""
    if generator is None or generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)
