"""The fast decode step against the model's own full forward, for each supported family."""

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rlscale.rlvr.rollout.decoder import DecoderWeights, decode_step
from rlscale.rlvr.rollout.kv_cache import KVCache
from rlscale.rlvr.rollout.sampler import SamplingParams, cached_forward, generate

SHAPE = dict(vocab_size=48, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)


def llama():
    return LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True))


def qwen2():  # q, k, v biases; untied output layer
    return Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=False))


def qwen3():  # RMSNorm on every query and key head before the rotary
    return Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16, tie_word_embeddings=False))


FAMILIES = {"llama": llama, "qwen2": qwen2, "qwen3": qwen3}
PROMPTS = [[5, 9, 13], [7], [20, 21, 22, 23, 24, 25], [30, 4]]


def build(family: str):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    with torch.no_grad():  # biases are zero at init; make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return model


def left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        attention[i, width - len(p):] = 1
    return ids, attention


@torch.no_grad()
def full_forward_last_logits(model, sequence):
    return model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0, -1].float()


@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_decode_steps_equal_the_full_forward(family):
    model = build(family)
    weights = DecoderWeights.from_model(model)
    assert weights is not None
    ids, attention = left_padded(PROMPTS)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    _, hf_cache = cached_forward(model, None, input_ids=ids, attention_mask=attention,
                                 position_ids=positions)
    cache = KVCache.from_prefill(hf_cache, attention, ids.shape[1] + 6)
    fed = [list(p) for p in PROMPTS]
    next_positions = positions[:, -1] + 1
    for step in range(6):
        tokens = torch.tensor([(11 * i + 5 * step) % 40 + 4 for i in range(len(PROMPTS))])
        logits = decode_step(weights, cache, tokens, next_positions)
        next_positions = next_positions + 1
        for i, token in enumerate(tokens.tolist()):
            fed[i].append(token)
            expected = full_forward_last_logits(model, fed[i])
            assert torch.allclose(logits[i], expected, atol=1e-5, rtol=0), (family, step, i)


@torch.no_grad()
def test_dropping_rows_leaves_the_others_unchanged():
    model = build("llama")
    weights = DecoderWeights.from_model(model)
    ids, attention = left_padded(PROMPTS)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    _, hf_cache = cached_forward(model, None, input_ids=ids, attention_mask=attention,
                                 position_ids=positions)
    cache = KVCache.from_prefill(hf_cache, attention, ids.shape[1] + 2)
    tokens, next_positions = torch.tensor([4, 5, 6, 7]), positions[:, -1] + 1
    decode_step(weights, cache, tokens, next_positions)
    keep = torch.tensor([1, 3])
    cache.keep_rows(keep)
    logits = decode_step(weights, cache, torch.tensor([8, 9]), next_positions[keep] + 1)
    for row, i in enumerate(keep.tolist()):
        expected = full_forward_last_logits(model, PROMPTS[i] + [int(tokens[i]), 8 + row])
        assert torch.allclose(logits[row], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_fast_decode_samples_what_the_model_forward_samples(top_p):
    """Same seed, same tokens and log-probs, rows finishing on EOS and leaving the batch."""
    model = build("qwen2")
    prompts = [[4 + (7 * i + j) % 40 for j in range(1 + i % 5)] for i in range(32)]
    with torch.no_grad():  # EOS as likely as the model's favourite token: inside the nucleus
        favourite = model(input_ids=torch.tensor([p[:1] for p in prompts])).logits[:, -1]
        model.lm_head.weight[2] = model.lm_head.weight[favourite.argmax(-1).mode().values]
    params = SamplingParams(max_new_tokens=40, temperature=1.0, top_p=top_p)
    runs = [generate(model, prompts, params, eos_token_id=2, pad_token_id=0,
                     generator=torch.Generator().manual_seed(3), fast_decode=fast)
            for fast in (True, False)]
    fast, slow = runs
    assert int((fast.lengths < params.max_new_tokens).sum()) >= 8  # compaction happened
    assert torch.equal(fast.completion_ids, slow.completion_ids)
    assert torch.equal(fast.lengths, slow.lengths)
    assert torch.allclose(fast.sampler_logprobs, slow.sampler_logprobs, atol=1e-5, rtol=0)
    assert fast.finish_reasons == slow.finish_reasons


def test_unsupported_models_use_their_own_forward():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=48, n_positions=64, n_embd=32, n_layer=2,
                                      n_head=2, eos_token_id=2)).eval()
    assert DecoderWeights.from_model(gpt2) is None
    out = generate(gpt2, PROMPTS, SamplingParams(max_new_tokens=5), eos_token_id=2,
                   pad_token_id=0, generator=torch.Generator().manual_seed(0))
    assert out.completion_ids.shape[0] == len(PROMPTS)
    sliding = LlamaForCausalLM(LlamaConfig(**SHAPE))
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert DecoderWeights.from_model(sliding) is None


@torch.no_grad()
def test_lora_adapters_are_folded_in_and_disabled_adapters_are_the_base():
    peft = pytest.importorskip("peft")
    base_logits = full_forward_last_logits(build("qwen2"), PROMPTS[2])
    model = peft.get_peft_model(build("qwen2"), peft.LoraConfig(r=4, target_modules="all-linear"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.normal_(0, 0.2)  # B starts at zero: make the adapters change the function
    weights = DecoderWeights.from_model(model)
    assert weights is not None
    ids, attention = left_padded([PROMPTS[2][:-1]])
    _, hf_cache = cached_forward(model, None, input_ids=ids, attention_mask=attention,
                                 position_ids=torch.arange(ids.shape[1])[None])
    cache = KVCache.from_prefill(hf_cache, attention, ids.shape[1] + 1)
    logits = decode_step(weights, cache, torch.tensor(PROMPTS[2][-1:]),
                         torch.tensor([ids.shape[1]]))[0]
    expected = full_forward_last_logits(model, PROMPTS[2])
    assert not torch.allclose(expected, base_logits, atol=1e-3)  # the adapters matter
    assert torch.allclose(logits, expected, atol=1e-5, rtol=0)
    with model.disable_adapter():
        plain = DecoderWeights.from_model(model)
        layer = plain.layers[0]
    base_qkv = build("qwen2").model.layers[0].self_attn
    assert torch.equal(layer.qkv.weight[: base_qkv.q_proj.weight.shape[0]], base_qkv.q_proj.weight)


@torch.no_grad()
def test_bf16_autocast_decodes_in_bf16_close_to_fp32():
    model = build("llama")
    prompts = [[4 + (3 * i + j) % 40 for j in range(3)] for i in range(4)]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1e-9)  # greedy
    fp32 = generate(model, prompts, params, eos_token_id=2, pad_token_id=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert DecoderWeights.from_model(model, torch.bfloat16).embed.dtype == torch.bfloat16
        bf16 = generate(model, prompts, params, eos_token_id=2, pad_token_id=0)
    assert next(model.parameters()).dtype == torch.float32  # the model itself is untouched
    agree = (fp32.completion_ids == bf16.completion_ids).float().mean().item()
    assert agree >= 0.75


def test_a_projection_is_f_linear_packed_or_not():
    from rlscale.rlvr.rollout.decoder import (
        MKL_PACKED,
        PACKED_BATCH_SIZES,
        PACKED_MAX_ROWS,
        PACKED_MIN_ROWS,
        Projection,
    )

    torch.manual_seed(0)
    weight, bias = torch.randn(256, 24), torch.randn(256)
    proj = Projection(weight, bias)
    assert proj.packable == MKL_PACKED and proj.shape == weight.shape
    for rows in (1, 3, 8, 17, 32, 33, 64, 9, 10, 11, 8):
        x = torch.randn(rows, 24)
        torch.testing.assert_close(proj(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    packed = list(proj._packed)  # the last sizes seen, 8 to 32 rows
    assert len(packed) <= PACKED_BATCH_SIZES
    assert all(PACKED_MIN_ROWS <= r <= PACKED_MAX_ROWS for r in packed)
    assert packed == ([9, 10, 11, 8] if MKL_PACKED else [])  # the oldest size goes first
    assert not Projection(torch.randn(100, 24), None).packable  # too narrow to pay


@pytest.mark.parametrize("shape", [(256, 24), (100, 128), (1024, 512), (512, 1536)])
def test_a_bf16_projection_is_f_linear_bit_for_bit(shape):
    """bf16 runs oneDNN on one packed copy of the weight for every batch size, with the
    bits of F.linear (so the engine's tokens and log-probs do not move)."""
    from rlscale.rlvr.rollout.decoder import ONEDNN_PACKED, Projection

    torch.manual_seed(0)
    weight, bias = torch.randn(*shape).bfloat16(), torch.randn(shape[0]).bfloat16()
    for b in (bias, None):
        proj = Projection(weight, b)
        assert proj.onednn == ONEDNN_PACKED and not proj.packable
        for rows in (1, 3, 8, 17, 32, 50, 64, 100):
            x = torch.randn(rows, shape[1]).bfloat16()
            assert torch.equal(proj(x), F.linear(x, weight, b)), rows
        assert len(proj._packed) == int(ONEDNN_PACKED)  # one copy, whatever the sizes


def test_decode_attention_bf16_through_sdpa_is_within_bf16_rounding_of_exact():
    """bf16 decode attention runs SDPA (fp32 accumulation); fp32 keeps the two matmuls, so an
    fp32 run samples what it sampled before."""
    from rlscale.rlvr.rollout.decoder import _attend

    torch.manual_seed(0)
    q, k, v = torch.randn(8, 2, 2, 32), torch.randn(8, 2, 40, 32), torch.randn(8, 2, 40, 32)
    bias = torch.zeros(8, 1, 1, 40)
    bias[:3, ..., :5] = float("-inf")  # three rows with left padding
    scale = 32 ** -0.5
    exact = torch.matmul((torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
                          + bias.double()).softmax(-1), v.double())
    fp32 = _attend(q, k, v, bias, scale)
    assert torch.equal(fp32, torch.matmul((torch.matmul(q, k.transpose(-1, -2)) * scale + bias)
                                          .softmax(-1), v))
    bf16 = _attend(*(x.bfloat16() for x in (q, k, v, bias)), scale)
    assert bf16.dtype == torch.bfloat16
    assert (bf16.double() - exact).abs().max() < 1e-2
    assert (bf16.double() - exact).abs().mean() < 1e-3
