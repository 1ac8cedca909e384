"""The trainer's forward: padded and packed layouts, log-probs, micro-batches, devices."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlscale.rlvr import objectives
from rlscale.rlvr.batch import build_policy_batch, micro_batches
from rlscale.rlvr.config import TrainConfig
from rlscale.rlvr.layout import first_fit_decreasing, packed_layout, padded_layout
from rlscale.rlvr.logprobs import completion_logprobs, token_logprobs
from rlscale.rlvr.loop import cxx_compiler
from rlscale.rlvr.model import build_tiny_model, enable_activation_checkpointing
from rlscale.rlvr.step_loss import StepLoss
from rlscale.rlvr.token_math import token_entropy_from_logits
from rlscale.rlvr.trainer import PolicyTrainer
from rlscale.runtime.device import DeviceError, resolve_device


def _batch(seed: int = 0, sequences: int = 6):
    """A left/right-padded batch of random prompts and completions of mixed lengths."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 90, (int(n),), generator=g).tolist()
               for n in torch.randint(2, 9, (sequences,), generator=g)]
    lengths = torch.randint(1, 7, (sequences,), generator=g)
    width = int(lengths.max())
    completions = torch.randint(4, 90, (sequences, width), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    completions = completions.masked_fill(mask == 0, 0)
    advantages = torch.randn(sequences, generator=g)
    return build_policy_batch(prompts, completions, mask, advantages,
                              torch.zeros(sequences, width), pad_token_id=0, policy_version=0)


def _model():
    torch.manual_seed(0)
    model, _ = build_tiny_model("tiny", seed=0)
    return model


def _reference_logprobs(model, batch, temperature=1.0):
    """The textbook computation: the full padded forward and a full log-softmax gather."""
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=positions, use_cache=False).logits
    width = batch.completion_ids.shape[1]
    logits = logits[:, batch.prompt_width - 1: batch.prompt_width - 1 + width] / temperature
    logp = logits.log_softmax(-1).gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    return logp * batch.mask, token_entropy_from_logits(logits) * batch.mask


def test_token_logprobs_equal_a_full_log_softmax_gather():
    logits = torch.randn(5, 7, 33) * 4
    targets = torch.randint(0, 33, (5, 7))
    full = logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), full, atol=1e-6)


@pytest.mark.parametrize("pack", [False, True])
def test_completion_logprobs_equal_the_full_forward(pack):
    model, batch = _model(), _batch()
    expected_logp, expected_entropy = _reference_logprobs(model, batch, temperature=0.7)
    logp, entropy = completion_logprobs(model, batch, 0.7, with_entropy=True, pack=pack)
    assert torch.allclose(logp, expected_logp, atol=1e-5)
    assert torch.allclose(entropy, expected_entropy, atol=1e-5)
    assert not entropy.requires_grad and logp.requires_grad


def test_packed_rows_hold_several_sequences_and_no_token_sees_another():
    batch = _batch(sequences=8)
    layout = packed_layout(batch.input_ids, batch.attention_mask, batch.prompt_width,
                           batch.mask, pad_token_id=0)
    padded = padded_layout(batch.input_ids, batch.attention_mask, batch.prompt_width, batch.mask)
    assert layout.input_ids.shape[0] < len(batch)  # packed: fewer rows
    assert layout.tokens < padded.tokens            # and fewer token slots than padding
    # Positions restart at 0 for each sequence: 8 sequences, plus the rows' tails.
    starts = int((layout.position_ids == 0).sum())
    assert starts >= len(batch)
    # Every completion token is read from exactly its own place.
    assert torch.equal(layout.input_ids[layout.logit_index[0], layout.logit_index[1] + 1],
                       batch.completion_ids[layout.token_index])


def test_first_fit_decreasing_fills_rows_within_width():
    rows = first_fit_decreasing([5, 3, 4, 2, 6, 1], width=7)
    assert sorted(k for r in rows for k in r) == list(range(6))
    assert all(sum([5, 3, 4, 2, 6, 1][k] for k in r) <= 7 for r in rows)
    assert len(rows) == 3  # 21 tokens into rows of 7: no waste possible beyond this


GRPO = dataclasses.replace(objectives.PRESETS["grpo"], kl_coef=0.0)


def _loss_and_grads(pack: bool, micro_batch_tokens: int = 0):
    """The trainer's step metrics, and the step's loss and gradients at the initial weights."""
    batch = _batch(seed=1, sequences=8)
    model = _model()
    logp, _ = completion_logprobs(model, batch, pack=pack)
    loss = objectives.policy_loss(objectives.LossInputs(
        logp, logp.detach(), batch.advantages, batch.mask, behaviour_logp=batch.sampler_logprobs,
        num_sequences=len(batch), num_tokens=float(batch.mask.sum())), GRPO).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    trainer = PolicyTrainer(_model(), None, StepLoss(GRPO),
                            TrainConfig(lr=1e-3, grad_clip=1e9, pack=pack,
                                        micro_batch_tokens=micro_batch_tokens),
                            temperature=1.0)
    metrics = trainer.step(batch, torch.Generator().manual_seed(0)).metrics
    return metrics, float(loss.detach()), grads


def test_packed_and_padded_batches_give_the_same_loss_and_gradients():
    m_pad, loss_pad, grads_pad = _loss_and_grads(pack=False)
    m_pack, loss_pack, grads_pack = _loss_and_grads(pack=True)
    assert abs(loss_pad - loss_pack) < 1e-6
    assert abs(m_pad["loss/loss"] - m_pack["loss/loss"]) < 1e-6
    for name, g in grads_pad.items():
        assert torch.allclose(g, grads_pack[name], atol=1e-6), name
    assert abs(m_pad["policy/entropy"] - m_pack["policy/entropy"]) < 1e-5


def test_micro_batches_by_token_budget_change_nothing_but_memory():
    whole, _, _ = _loss_and_grads(pack=False)
    split, _, _ = _loss_and_grads(pack=False, micro_batch_tokens=20)
    assert abs(whole["policy/grad_norm"] - split["policy/grad_norm"]) < 1e-6
    assert abs(whole["policy/entropy"] - split["policy/entropy"]) < 1e-6


def test_micro_batches_respect_rows_and_tokens():
    index = torch.tensor([3, 0, 2, 1, 4])
    lengths = torch.tensor([10, 4, 6, 30, 5])
    groups = [g.tolist() for g in micro_batches(index, lengths, rows=0, tokens=12)]
    assert groups == [[3], [0], [2, 1], [4]]  # 30 tokens alone; never reordered
    groups = [g.tolist() for g in micro_batches(index, lengths, rows=2, tokens=100)]
    assert groups == [[3, 0], [2, 1], [4]]
    assert [g.tolist() for g in micro_batches(index, lengths)] == [[3, 0, 2, 1, 4]]


def test_gradient_checkpointing_gives_the_same_gradients():
    batch = _batch(seed=2)
    grads = []
    for checkpointing in (False, True):
        model = _model()
        if checkpointing:
            enable_activation_checkpointing(model)
        model.train()
        logp, _ = completion_logprobs(model, batch)
        (logp.sum()).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-6), name


def test_bf16_autocast_keeps_fp32_weights_and_close_logprobs():
    model, batch = _model(), _batch(seed=3)
    trainer = PolicyTrainer(model, None, StepLoss(GRPO), TrainConfig(lr=1e-4, grad_clip=1.0),
                            temperature=1.0, compute_dtype="bfloat16")
    fp32 = trainer.score_logprobs(model, batch)
    trainer.compute_dtype = "float32"
    exact = trainer.score_logprobs(model, batch)
    assert fp32.dtype == torch.float32
    assert (fp32 - exact).abs().max() < 0.1  # bf16 rounding, not a different model
    trainer.compute_dtype = "bfloat16"
    trainer.step(batch, torch.Generator().manual_seed(0))
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_device_auto_and_cpu_and_a_missing_gpu():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="device: cuda, but torch sees no CUDA GPU"):
            resolve_device("cuda")


@pytest.mark.slow  # ~40 s of compilation on one core, even for one layer
@pytest.mark.skipif(cxx_compiler() is None, reason="torch.compile on CPU needs a C++ compiler")
def test_the_compiled_update_matches_the_eager_one():
    """train.compile: the update's forward through torch.compile'd decoder gives the eager
    step's loss and weights, over two batches of different packed shapes (one compilation,
    dynamic shapes). A 1-layer model keeps the compilation short."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def small_model():
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
            tie_word_embeddings=True))

    trainers = [PolicyTrainer(small_model(), None, StepLoss(GRPO),
                              TrainConfig(lr=1e-2, grad_clip=1e9, pack=True, compile=compiled),
                              temperature=1.0) for compiled in (False, True)]
    assert trainers[0].update_decoder is None and trainers[1].update_decoder is not None
    torch._dynamo.reset()
    for seed in (4, 5):
        batch = _batch(seed=seed, sequences=6 + seed)
        eager, compiled = (t.step(batch, torch.Generator().manual_seed(0)).metrics
                           for t in trainers)
        assert abs(eager["loss/loss"] - compiled["loss/loss"]) < 1e-5
        assert abs(eager["policy/grad_norm"] - compiled["policy/grad_norm"]) < 1e-5
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    for (name, a), (_, b) in zip(trainers[0].model.named_parameters(),
                                 trainers[1].model.named_parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5), name
