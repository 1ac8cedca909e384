"""Log-probs (and entropies) of completion tokens under a model: the trainer's forward.

The output layer runs only where the loss needs it: the decoder runs over the layout's
tokens (rlvr/layout.py), and the vocabulary projection over the positions that predict
completion tokens; the log-prob is the target's logit minus the row's logsumexp, never a
full `[N, V]` log-softmax copy.
"""

from __future__ import annotations

import torch

from .attention import training_attention
from .layout import Layout, packed_layout, padded_layout
from .token_math import token_entropy_from_logits


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] = logits[target] - logsumexp(logits), over the last axis.

    `[..., V]` logits and `[...]` targets -> `[...]`, in float32 at least."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    picked = logits.gather(-1, targets[..., None]).squeeze(-1)
    return picked - logits.logsumexp(-1)


def plain_output_layer(model) -> bool:
    """Whether the model's logits are just its output embedding of the last hidden state
    (Llama, Qwen2, Mistral, GPT-2, ...), so the projection can run on chosen positions. Models
    that scale or soft-cap their logits take the full forward instead."""
    config = model.config
    return (hasattr(model, "get_decoder") and model.get_output_embeddings() is not None
            and getattr(config, "final_logit_softcapping", None) is None
            and getattr(config, "logit_scale", None) is None
            and getattr(config, "logits_scaling", None) is None)


def layout_logits(model, layout: Layout, decoder=None) -> torch.Tensor:
    """`[N, V]` logits at `layout.logit_index` (the positions predicting completion tokens).
    `decoder`: what runs the model's decoder (e.g. a compiled one) where its output layer is
    plain; default the model's own."""
    inputs = dict(input_ids=layout.input_ids, attention_mask=layout.attention_mask,
                  position_ids=layout.position_ids, use_cache=False)
    with training_attention(model):
        if hasattr(model, "completion_logits"):  # a sharded policy (sharding.CompletionLogits)
            return model.completion_logits(layout.logit_index, inputs)
        if plain_output_layer(model):
            run = model.get_decoder() if decoder is None else decoder
            hidden = run(**inputs).last_hidden_state
            return model.get_output_embeddings()(hidden[layout.logit_index])
        return model(**inputs).logits[layout.logit_index]


def make_layout(batch, pack: bool) -> Layout:
    """`batch` is a PolicyBatch (or any record with its fields). Every completion token is in
    the layout, tool-written ones too (the context later tokens see); the loss mask
    (`batch.mask`) drops those afterwards. A packed row's tail is a segment of its own whose
    outputs are never read, so its token id does not matter."""
    completion = batch.attention_mask[:, batch.prompt_width:]
    if pack:
        return packed_layout(batch.input_ids, batch.attention_mask, batch.prompt_width,
                             completion, pad_token_id=0)
    return padded_layout(batch.input_ids, batch.attention_mask, batch.prompt_width, completion)


def completion_logprobs(model, batch, temperature: float = 1.0, with_entropy: bool = False,
                        pack: bool = False,
                        decoder=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[B, T]` log-probs of the completion tokens at `temperature` (0 on padding), and with
    `with_entropy` the policy's entropy at each (detached: a metric and a token filter, never
    differentiated). `decoder`: as `layout_logits`'s."""
    layout = make_layout(batch, pack)
    logits = layout_logits(model, layout, decoder)
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.completion_ids[layout.token_index]
    picked = token_logprobs(logits, targets)  # float32, or float64 for a float64 model
    logp = torch.zeros(batch.completion_ids.shape, dtype=picked.dtype,
                       device=batch.completion_ids.device)
    logp = logp.index_put(layout.token_index, picked)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = torch.zeros_like(logp).index_put(
                layout.token_index, token_entropy_from_logits(logits.detach()))
    return logp, entropy
