"""The continuous-batching engine against the static sampler and a plain full forward."""

import random

import pytest
import torch

from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.rollout.engine import ContinuousBatchingEngine
from rlscale.rlvr.rollout.sampler import SamplingParams, generate
from rlscale.rlvr.rollout.sampling import top_p_filter
from rlscale.rlvr.rollout.types import EngineSampling, GenerationRequest

PROMPTS = ["1+2=", "347+85=", "19*9=", "3 12 17->41:", "x", "12+5=", "99*9=", "7-3=",
           "123456+7=", "0="]


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny", seed=1)
    return model.eval(), tokenizer


def encode(tokenizer, prompts=PROMPTS):
    return [tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]


def make_engine(lm, sampling, slots, seed=0, model=None):
    model_, tokenizer = lm
    return ContinuousBatchingEngine(model or model_, sampling, slots=slots,
                                    eos_token_id=tokenizer.eos_token_id,
                                    pad_token_id=tokenizer.pad_token_id, seed=seed)


@torch.no_grad()
def sampled_logprobs(model, prompt, completion, temperature, top_p):
    """log mu of each completion token from one unpadded forward: temperature, top-p,
    renormalised -- the distribution the engine claims to have sampled from."""
    ids = torch.tensor([list(prompt) + completion])
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    logits = logits[len(prompt) - 1: len(prompt) - 1 + len(completion)] / temperature
    logp = top_p_filter(logits, top_p).log_softmax(-1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.mark.parametrize("slots", [1, 2, 3, 10])
@pytest.mark.parametrize("order_seed", [0, 1])
def test_greedy_tokens_equal_static_sampler(lm, slots, order_seed):
    model, tokenizer = lm
    ids = encode(tokenizer)
    max_new = [3 + (i * 5) % 11 for i in range(len(ids))]  # per-request caps
    reference = generate(model, [list(p) for p in ids], SamplingParams(max(max_new), 0.0),
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    order = list(range(len(ids)))
    random.Random(order_seed).shuffle(order)  # a different refill order
    engine = make_engine(lm, EngineSampling(temperature=0.0), slots)
    for i in order:
        engine.add_request(GenerationRequest(i, ids[i], max_new[i]))
    done = {c.request_id: c for c in engine.run()}
    assert sorted(done) == list(range(len(ids)))
    for i in range(len(ids)):
        n = int(reference.lengths[i])
        expected = reference.completion_ids[i, :n].tolist()[: max_new[i]]
        assert done[i].token_ids == expected, i
        assert done[i].finish_reason == ("stop" if expected[-1] == tokenizer.eos_token_id
                                         else "length")
    assert not engine.has_unfinished()
    assert engine.stats.decode_steps > 0 and 0 < engine.stats.slot_utilisation <= 1


class CountsForwardRows(torch.nn.Module):
    """A model that records the rows of each forward it runs with a padding mask (a prefill)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model, self.config, self.prefill_rows = model, model.config, []

    def forward(self, input_ids, **kwargs):
        self.prefill_rows.append(input_ids.shape[0])
        return self.model(input_ids=input_ids, **kwargs)


def test_a_groups_requests_admitted_together_share_one_prefill(lm):
    """G requests of one prompt admitted in one refill: one prefill row, and each request
    continues exactly as the prompt alone does (greedy)."""
    model, tokenizer = lm
    ids = encode(tokenizer, [PROMPTS[1], PROMPTS[3]])
    counting = CountsForwardRows(model)
    engine = make_engine(lm, EngineSampling(temperature=0.0), slots=6, model=counting)
    for i in range(6):
        engine.add_request(GenerationRequest(i, ids[i // 3], 8))
    done = {c.request_id: c for c in engine.run()}
    assert counting.prefill_rows[0] == 2
    alone = generate(model, [list(p) for p in ids], SamplingParams(8, 0.0),
                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    for i in range(6):
        n = int(alone.lengths[i // 3])
        assert done[i].token_ids == alone.completion_ids[i // 3, :n].tolist(), i


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.8), (1.3, 0.5)])
def test_mu_logprobs_match_full_forward(lm, temperature, top_p):
    model, tokenizer = lm
    engine = make_engine(lm, EngineSampling(temperature, top_p), slots=3, seed=4)
    ids = encode(tokenizer)
    for i, p in enumerate(ids):
        engine.add_request(GenerationRequest(i, p, 12))
    for c in engine.run():
        expected = sampled_logprobs(model, ids[c.request_id], c.token_ids, temperature, top_p)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
        assert c.versions == [0] * len(c)
        if top_p < 1:  # the truncation shows: mu >= the untruncated probability
            untruncated = sampled_logprobs(model, ids[c.request_id], c.token_ids, temperature, 1.0)
            assert (torch.tensor(c.logprobs) >= untruncated - 1e-5).all()


def test_ignore_eos_gives_exact_lengths(lm):
    engine = make_engine(lm, EngineSampling(1.0, 1.0, ignore_eos=True), slots=4)
    ids = encode(lm[1])
    for i, p in enumerate(ids):
        engine.add_request(GenerationRequest(i, p, 5 + i))
    done = engine.run()
    assert {c.request_id: len(c) for c in done} == {i: 5 + i for i in range(len(ids))}
    assert all(c.finish_reason == "length" for c in done)


@pytest.mark.parametrize("recompute", [True, False])
def test_inflight_update_new_version_and_new_weights(lm, recompute):
    model, tokenizer = lm
    new_model, _ = build_tiny_model("tiny", seed=7)
    new_model.eval()
    engine = make_engine(lm, EngineSampling(1.0, 1.0, ignore_eos=True), slots=4,
                         model=build_tiny_model("tiny", seed=1)[0])
    engine.recompute_cache_on_update = recompute
    ids = encode(tokenizer)
    for i, p in enumerate(ids):
        engine.add_request(GenerationRequest(i, p, 10))
    done = []
    for _ in range(4):
        done += engine.step()
    engine.load_weights(new_model.state_dict(), version=5)
    done += engine.run()
    assert len(done) == len(ids)
    switched = 0
    for c in done:
        assert c.versions == sorted(c.versions) and set(c.versions) <= {0, 5}
        old = [t for t, v in enumerate(c.versions) if v == 0]
        new = [t for t, v in enumerate(c.versions) if v == 5]
        prompt = ids[c.request_id]
        mu = torch.tensor(c.logprobs)
        if old:
            ref = sampled_logprobs(model, prompt, c.token_ids, 1.0, 1.0)
            assert torch.allclose(mu[old], ref[old], atol=1e-4)
        if new and recompute:
            # every token after the update is drawn from exactly the new weights
            ref = sampled_logprobs(new_model, prompt, c.token_ids, 1.0, 1.0)
            assert torch.allclose(mu[new], ref[new], atol=1e-4)
        switched += bool(old and new)
    assert switched > 0  # some requests really were mid-flight at the update


def test_abort_all_returns_every_unfinished_request(lm):
    engine = make_engine(lm, EngineSampling(1.0, 1.0, ignore_eos=True), slots=2)
    for i, p in enumerate(encode(lm[1])[:5]):
        engine.add_request(GenerationRequest(i, p, 20))
    engine.step()
    assert sorted(engine.abort_all()) == [0, 1, 2, 3, 4]
    assert not engine.has_unfinished() and engine.step() == []


def test_bad_requests_are_refused(lm):
    engine = make_engine(lm, EngineSampling(), slots=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.add_request(GenerationRequest(0, (1, 2), 0))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request(GenerationRequest(1, (), 4))


def test_a_model_the_decoder_does_not_support_runs_on_its_own_forward():
    """GPT-2 goes through the model's forward over the same cache: mu still matches."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlscale.rlvr.rollout.decoder import DecoderWeights

    torch.manual_seed(0)
    _, tokenizer = build_tiny_model("tiny", seed=1)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32,
                                      n_layer=2, n_head=2)).eval()
    assert DecoderWeights.from_model(gpt2) is None
    engine = make_engine((gpt2, tokenizer), EngineSampling(1.0, 1.0), slots=3, seed=2)
    ids = encode(tokenizer)
    for i, p in enumerate(ids):
        engine.add_request(GenerationRequest(i, p, 9))
    done = engine.run()
    assert len(done) == len(ids)
    for c in done:
        expected = sampled_logprobs(gpt2, ids[c.request_id], c.token_ids, 1.0, 1.0)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_kv_cache_window_moves_and_grows_without_losing_columns():
    from rlscale.rlvr.rollout.kv_cache import KVCache

    cache = KVCache(layers=1, rows=2, kv_heads=1, head_dim=1, capacity=3,
                    dtype=torch.float32, device=torch.device("cpu"))
    for value in range(1, 6):  # past the capacity: the buffer grows
        column = cache.append_column()
        cache.keys[0, :, 0, column, 0] = value
    assert cache.width == 5 and cache.capacity >= 5
    assert cache.layer_window(0)[0][:, 0, :, 0].tolist() == [[1, 2, 3, 4, 5]] * 2
    pad = cache.start + 2  # more than the room on the left: reallocated
    cache.pad_left(pad)
    assert cache.width == 5 + pad
    assert cache.attention_mask().tolist() == [[0] * pad + [1] * 5] * 2
    assert cache.layer_window(0)[0][0, 0, pad:, 0].tolist() == [1, 2, 3, 4, 5]
    cache.bias[0, 0, 0, cache.start + pad] = float("-inf")  # row 0 leaves its first column
    cache.trim_left()
    assert cache.width == 5
    cache.bias[:, 0, 0, cache.start] = float("-inf")
    cache.trim_left()
    assert cache.width == 4 and cache.layer_window(0)[0][1, 0, :, 0].tolist() == [2, 3, 4, 5]
