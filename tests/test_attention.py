"""The trainer's bf16 CPU attention (rlvr/attention.py): same values and gradients as SDPA,
no NaN from padding queries, used only where it pays, and nothing of it in a saved model."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from rlscale.rlvr import attention
from rlscale.rlvr.batch import build_policy_batch
from rlscale.rlvr.logprobs import completion_logprobs
from rlscale.rlvr.model import build_tiny_model


def _qkv_and_mask(dtype, batch=4, heads=4, t=12, d=16, pad=3):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, t, d, generator=g, dtype=torch.float64)
               for _ in range(3))
    mask = torch.ones(t, t, dtype=torch.bool).tril()[None, None].repeat(batch, 1, 1, 1)
    mask[:2, :, :, :pad] = False  # two left-padded rows: their first `pad` queries see nothing
    return [x.to(dtype).requires_grad_() for x in (q, k, v)], mask


def _valid_rows(mask):
    return mask.any(-1, keepdim=True)


def _out_and_grads(fn, q, k, v, valid):
    """The output and the gradients of a weighted sum of it over the queries that attend to
    something (a padding query's output reaches no loss in a model: nothing reads it)."""
    out = fn(q, k, v)
    weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape) * valid
    (out.double() * weights).sum().backward()
    return out.double(), q.grad.double(), k.grad.double(), v.grad.double()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_matmul_attention_equals_sdpa_values_and_gradients(dtype, tol):
    (q, k, v), mask = _qkv_and_mask(dtype)
    (q64, k64, v64), _ = _qkv_and_mask(torch.float64)
    scale = q.shape[-1] ** -0.5
    valid = _valid_rows(mask)
    ours = _out_and_grads(lambda a, b, c: attention.matmul_attention(a, b, c, mask, scale),
                          q, k, v, valid)
    ref = _out_and_grads(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask).nan_to_num(),
        q64, k64, v64, valid)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, ref, strict=True):
        assert torch.isfinite(a).all(), name  # padding queries average, never NaN
        err = ((a - b) * valid).abs().max() / b.abs().max() if name == "out" else \
            (a - b).abs().max() / b.abs().max()
        assert err < tol, (name, float(err))


def test_no_mask_means_causal_aligned_to_the_last_key():
    (q, k, v), _ = _qkv_and_mask(torch.float64)
    ours = attention.matmul_attention(q, k, v, None, q.shape[-1] ** -0.5)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(ours, ref, atol=1e-10)
    # fewer queries than keys (a continuation): query i sees keys up to S - T + i
    tail = attention.matmul_attention(q[:, :, -4:], k, v, None, q.shape[-1] ** -0.5)
    assert torch.allclose(tail, ref[:, :, -4:], atol=1e-10)


def test_pays_only_for_a_differentiated_bf16_cpu_forward():
    q = torch.randn(2, 4, 8, 16, requires_grad=True)
    assert not attention.pays(q, 8)                       # fp32: SDPA's backward is faster
    with torch.autocast("cpu", torch.bfloat16):
        assert attention.pays(q, 8)                       # fp32 query under bf16 autocast
        assert not attention.pays(q[:, :, :1], 8)         # a decode step
        with torch.no_grad():
            assert not attention.pays(q, 8)               # scoring: nothing to differentiate
        big = torch.empty(attention.MAX_SCORES // (4 * 8) + 1, 4, 8, 16, requires_grad=True)
        assert not attention.pays(big, 8)                 # too many scores to keep: SDPA
    assert attention.pays(q.detach().bfloat16().requires_grad_(), 8)


def _batch(sequences=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 90, (int(n),), generator=g).tolist()
               for n in torch.randint(2, 9, (sequences,), generator=g)]
    lengths = torch.randint(1, 9, (sequences,), generator=g)
    width = int(lengths.max())
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    completions = torch.randint(4, 90, (sequences, width), generator=g).masked_fill(mask == 0, 0)
    return build_policy_batch(prompts, completions, mask, torch.randn(sequences, generator=g),
                              torch.zeros(sequences, width), pad_token_id=0, policy_version=0)


def _logp_and_grads(model, batch, pack):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", torch.bfloat16):
        logp, _ = completion_logprobs(model, batch, pack=pack)
    (logp * batch.mask * batch.advantages[:, None]).sum().backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("pack", [False, True])
def test_the_trainer_forward_uses_it_with_sdpa_results(monkeypatch, pack):
    """bf16 log-probs and weight gradients of the tiny model through matmul attention against
    the same forward on SDPA, in the padded and the packed layout."""
    model, _ = build_tiny_model("tiny", seed=0)
    batch = _batch()
    calls = []
    real = attention.matmul_attention
    monkeypatch.setattr(attention, "matmul_attention",
                        lambda *a: calls.append(1) or real(*a))
    logp, grads = _logp_and_grads(model, batch, pack)
    assert len(calls) == model.config.num_hidden_layers
    assert model.config._attn_implementation == "sdpa"  # restored after the forward
    monkeypatch.setattr(attention, "pays", lambda *a: False)
    ref_logp, ref_grads = _logp_and_grads(model, batch, pack)
    assert len(calls) == model.config.num_hidden_layers  # SDPA this time
    assert torch.isfinite(logp).all()
    assert (logp - ref_logp).abs().max() < 0.05
    for g, r in zip(grads, ref_grads, strict=True):
        assert torch.isfinite(g).all()
        assert (g - r).norm() <= 0.05 * r.norm() + 1e-6


def test_a_saved_model_keeps_its_own_attention_setting(tmp_path):
    model, _ = build_tiny_model("tiny", seed=0)
    with attention.training_attention(model):
        assert model.config._attn_implementation == attention.NAME
        model.save_pretrained(tmp_path)
    assert attention.NAME not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
    model.config._attn_implementation = "eager"
    with attention.training_attention(model):  # not an SDPA model: left alone
        assert model.config._attn_implementation == "eager"
