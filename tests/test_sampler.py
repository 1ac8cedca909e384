"""The KV-cached sampler against a plain full forward of the same model."""

import pytest
import torch

from rlscale.rlvr.model import build_tiny_model, load_model, save_model
from rlscale.rlvr.rollout.sampler import SamplingParams, decode_completions, generate

PROMPTS = ["1+2=", "347+85=", "19*9=", "3 12 17->41:", "x"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    torch.manual_seed(0)
    model, tokenizer = build_tiny_model("tiny", seed=1)
    path = save_model(model, tokenizer, tmp_path_factory.mktemp("tiny"))
    model, tokenizer = load_model(path)
    model.eval()
    return model, tokenizer


def encode(tokenizer, prompts=PROMPTS):
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]


def run(lm, params, seed=0, prompts=PROMPTS, version=0, model=None):
    model_, tokenizer = lm
    return generate(model or model_, encode(tokenizer, prompts), params,
                    eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                    generator=torch.Generator().manual_seed(seed), policy_version=version)


@torch.no_grad()
def reference_logits(model, prompt, completion):
    """Logits predicting each completion token: one unpadded forward, no cache."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    return logits[len(prompt) - 1: len(prompt) - 1 + len(completion)]


class ForcedStop(torch.nn.Module):
    """Wraps a model so that row i emits EOS exactly at completion step stop[i] (None: never).

    Every other step keeps the model's own logits with EOS (and the other special tokens)
    forbidden, so a row without a
    stop runs to max_new_tokens. The step index is read off the attention mask's width. The
    sampler drops finished rows from the batch (all of them at once, order kept): a batch
    smaller than the rows alive means the rows already stopped have left.
    """

    def __init__(self, model, eos: int, stop: list[int | None]) -> None:
        super().__init__()
        self.model, self.eos, self.stop = model, eos, stop
        self.prompt_width = None
        self.alive = list(range(len(stop)))

    def forward(self, input_ids, attention_mask, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        if self.prompt_width is None:
            self.prompt_width = attention_mask.shape[1]
        step = attention_mask.shape[1] - self.prompt_width
        if input_ids.shape[0] < len(self.alive):
            self.alive = [r for r in self.alive if self.stop[r] is None or self.stop[r] >= step]
        assert len(self.alive) == input_ids.shape[0]
        logits = out.logits.clone()
        logits[:, -1, :4] = float("-inf")  # no special token (pad, bos, eos, unk) but a stop
        for row, stop in enumerate(self.stop[r] for r in self.alive):
            if stop == step:
                logits[row, -1, :] = float("-inf")
                logits[row, -1, self.eos] = 0.0
        out.logits = logits
        return out


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_sampler_logprobs_match_full_forward(lm, temperature):
    model, tokenizer = lm
    ids = encode(tokenizer)
    assert len({len(p) for p in ids}) == len(ids)  # all different lengths: left padding matters
    rollout = run(lm, SamplingParams(max_new_tokens=10, temperature=temperature), seed=3)
    assert rollout.sampler_logprobs.dtype == torch.float32
    for i, prompt in enumerate(ids):
        n = int(rollout.lengths[i])
        completion = rollout.completion_ids[i, :n].tolist()
        expected = (reference_logits(model, prompt, completion) / temperature).log_softmax(-1)
        expected = expected.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
        assert torch.allclose(rollout.sampler_logprobs[i, :n], expected, atol=1e-4, rtol=0), i


def test_padded_batch_equals_prompts_one_by_one(lm):
    """Left padding must not change what a prompt sees: greedy continuations agree."""
    params = SamplingParams(max_new_tokens=8, top_p=1e-9)
    batch = run(lm, params)
    for i, prompt in enumerate(PROMPTS):
        alone = run(lm, params, prompts=[prompt])
        n = int(alone.lengths[0])
        assert torch.equal(batch.completion_ids[i, :n], alone.completion_ids[0, :n])
        assert torch.allclose(batch.sampler_logprobs[i, :n], alone.sampler_logprobs[0, :n],
                              atol=1e-4, rtol=0)


class CountsPrefillRows(torch.nn.Module):
    """A model that records the rows of its first forward (the prefill)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model, self.prefill_rows = model, None

    def forward(self, input_ids, **kwargs):
        if self.prefill_rows is None:
            self.prefill_rows = input_ids.shape[0]
        return self.model(input_ids=input_ids, **kwargs)


def test_the_completions_of_one_prompt_share_its_prefill(lm):
    """A GRPO batch holds each prompt G times: one prefill row each, its keys and values
    copied to the G rows, which then continue exactly as the prompt alone does (greedy)."""
    model, _ = lm
    params = SamplingParams(max_new_tokens=8, top_p=1e-9)
    prompts = [PROMPTS[1]] * 3 + [PROMPTS[3]] * 3
    counting = CountsPrefillRows(model)
    grouped = run(lm, params, prompts=prompts, model=counting)
    assert counting.prefill_rows == 2
    for i, prompt in enumerate(prompts):
        alone = run(lm, params, prompts=[prompt])
        n = int(alone.lengths[0])
        assert int(grouped.lengths[i]) == n
        assert torch.equal(grouped.completion_ids[i, :n], alone.completion_ids[0, :n])
        assert torch.allclose(grouped.sampler_logprobs[i, :n], alone.sampler_logprobs[0, :n],
                              atol=1e-4, rtol=0)


def test_length_reached_without_eos(lm):
    model, tokenizer = lm
    forced = ForcedStop(model, tokenizer.eos_token_id, [None] * len(PROMPTS))
    rollout = run(lm, SamplingParams(max_new_tokens=6), model=forced)
    assert rollout.completion_ids.shape == (len(PROMPTS), 6)
    assert rollout.lengths.tolist() == [6] * len(PROMPTS)
    assert rollout.finish_reasons == ["length"] * len(PROMPTS)
    assert rollout.mask.eq(1).all()
    assert (rollout.completion_ids != tokenizer.eos_token_id).all()
    assert (rollout.sampler_logprobs < 0).all()


def test_stop_on_eos_lengths_mask_and_padding(lm):
    model, tokenizer = lm
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    #         EOS first  EOS at 3  never  EOS on last step  EOS at 1
    stops = [0, 3, None, 5, 1]
    forced = ForcedStop(model, eos, stops)
    rollout = run(lm, SamplingParams(max_new_tokens=6), model=forced)
    assert rollout.lengths.tolist() == [1, 4, 6, 6, 2]  # EOS counted in the length
    assert rollout.finish_reasons == ["stop", "stop", "length", "stop", "stop"]
    assert rollout.completion_ids.shape == (5, 6)
    expected_mask = torch.tensor([[1, 0, 0, 0, 0, 0],
                                  [1, 1, 1, 1, 0, 0],
                                  [1, 1, 1, 1, 1, 1],
                                  [1, 1, 1, 1, 1, 1],
                                  [1, 1, 0, 0, 0, 0]], dtype=torch.float32)
    assert torch.equal(rollout.mask, expected_mask)
    assert rollout.mask.dtype == torch.float32
    for row, stop in enumerate(stops):
        n = int(rollout.lengths[row])
        if stop is not None:
            assert rollout.completion_ids[row, stop] == eos
            assert rollout.sampler_logprobs[row, stop] == pytest.approx(0.0, abs=1e-6)  # p = 1
            assert (rollout.completion_ids[row, :stop] != eos).all()
        assert (rollout.completion_ids[row, n:] == pad).all()
        assert (rollout.sampler_logprobs[row, n:] == 0).all()
        assert (rollout.sampler_logprobs[row, :n][rollout.completion_ids[row, :n] != eos] < 0).all()
    texts = decode_completions(tokenizer, rollout)
    assert texts[0] == ""
    assert len(texts[1]) == 3 and len(texts[2]) == 6 and len(texts[3]) == 5
    assert "</s>" not in "".join(texts)


def test_width_is_the_longest_completion_when_all_stop_early(lm):
    model, tokenizer = lm
    forced = ForcedStop(model, tokenizer.eos_token_id, [0, 2, 1, 0, 2])
    rollout = run(lm, SamplingParams(max_new_tokens=20), model=forced)
    assert rollout.lengths.tolist() == [1, 3, 2, 1, 3]
    assert rollout.completion_ids.shape == (5, 3)
    assert rollout.mask.sum().item() == 10
    assert set(rollout.finish_reasons) == {"stop"}


def test_same_seed_same_samples(lm):
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    a, b = run(lm, params, seed=11), run(lm, params, seed=11)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.sampler_logprobs, b.sampler_logprobs)
    assert torch.equal(a.lengths, b.lengths)
    c = run(lm, params, seed=12)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_generator_not_global_rng_decides(lm):
    params = SamplingParams(max_new_tokens=8)
    torch.manual_seed(1)
    a = run(lm, params, seed=5)
    torch.manual_seed(2)
    b = run(lm, params, seed=5)
    assert torch.equal(a.completion_ids, b.completion_ids)


def test_tiny_top_p_is_greedy(lm):
    model, tokenizer = lm
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1e-6)
    rollouts = [run(lm, params, seed=s) for s in range(3)]
    for r in rollouts[1:]:
        assert torch.equal(r.completion_ids, rollouts[0].completion_ids)
    ids = encode(tokenizer)
    for i, prompt in enumerate(ids):
        n = int(rollouts[0].lengths[i])
        completion = rollouts[0].completion_ids[i, :n].tolist()
        assert completion == reference_logits(model, prompt, completion).argmax(-1).tolist()
        # mu is the distribution actually sampled from: top-p keeps one token, log(1) = 0
        assert torch.allclose(rollouts[0].sampler_logprobs[i, :n], torch.zeros(n))


def test_top_p_keeps_the_nucleus_only(lm):
    """With top_p = 0.5 every drawn token lies in the smallest set holding >= 50% mass."""
    model, tokenizer = lm
    rollout = run(lm, SamplingParams(max_new_tokens=6, top_p=0.5), seed=2)
    for i, prompt in enumerate(encode(tokenizer)):
        n = int(rollout.lengths[i])
        completion = rollout.completion_ids[i, :n].tolist()
        probs = reference_logits(model, prompt, completion).softmax(-1)
        for t, token in enumerate(completion):
            sorted_probs, order = probs[t].sort(descending=True)
            before = sorted_probs.cumsum(0) - sorted_probs
            nucleus = set(order[before < 0.5 - 1e-5].tolist())
            assert token in nucleus


@pytest.mark.parametrize("version", [0, 7, 123])
def test_policy_version_passes_through(lm, version):
    rollout = run(lm, SamplingParams(max_new_tokens=2), version=version)
    assert rollout.policy_version == version
    assert rollout.prompt_ids == encode(lm[1])


def test_sampling_by_cdf_draws_each_token_at_its_probability_and_never_a_zero():
    from rlscale.rlvr.rollout.sampling import CDF_BLOCK, sample_by_cdf

    vocab = 5 * CDF_BLOCK + 37                      # a last block that is partly padding
    weights = torch.zeros(vocab, dtype=torch.float32)
    support = torch.tensor([0, 1, CDF_BLOCK - 1, CDF_BLOCK, 3 * CDF_BLOCK + 5, vocab - 1])
    weights[support] = torch.tensor([0.3, 1e-3, 0.2, 0.15, 0.249, 0.1])
    draws = 200_000
    probs = (weights * 7.0).expand(draws, vocab)    # unnormalised is fine
    chosen = sample_by_cdf(probs, torch.Generator().manual_seed(0))
    counts = torch.bincount(chosen, minlength=vocab).double()
    assert counts.sum() == draws and counts[weights == 0].sum() == 0
    expected = weights.double() / weights.sum() * draws
    sigma = (expected * (1 - expected / draws)).sqrt()
    assert ((counts[support] - expected[support]).abs() <= 5 * sigma[support] + 1).all()
    again = sample_by_cdf(probs[:1000], torch.Generator().manual_seed(3))
    assert torch.equal(again, sample_by_cdf(probs[:1000], torch.Generator().manual_seed(3)))


def test_sample_next_keeps_multinomial_below_the_cdf_vocabulary():
    """The character vocabulary's streams (every documented run) are torch.multinomial's;
    a large vocabulary draws by inverse CDF. Both report the drawn tokens' log-probs."""
    from rlscale.rlvr.rollout.sampling import CDF_MIN_VOCAB, sample_next

    torch.manual_seed(0)
    small = torch.randn(16, 100)
    chosen, logp = sample_next(small, 1.0, 1.0, torch.Generator().manual_seed(5))
    expected = torch.multinomial(small.log_softmax(-1).exp(), 1,
                                 generator=torch.Generator().manual_seed(5)).squeeze(-1)
    assert torch.equal(chosen, expected)
    large = torch.randn(16, CDF_MIN_VOCAB * 3)
    chosen, logp = sample_next(large, 0.7, 0.9, torch.Generator().manual_seed(5))
    reference = large.div(0.7).log_softmax(-1)
    assert chosen.max() < large.shape[1] and torch.isfinite(logp).all()
    kept = logp >= reference.gather(-1, chosen[:, None]).squeeze(-1) - 1e-6  # top-p renormalises up
    assert kept.all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")
def test_sampling_by_cdf_on_cuda_draws_the_cpu_tokens_and_returns_them_on_the_cpu():
    from rlscale.rlvr.rollout.sampling import CDF_MIN_VOCAB, sample_by_cdf, sample_next
    logits = torch.randn(64, CDF_MIN_VOCAB * 5 + 3, generator=torch.Generator().manual_seed(0))
    probs = logits.softmax(-1)
    on_cpu = sample_by_cdf(probs, torch.Generator().manual_seed(1))
    on_gpu = sample_by_cdf(probs.cuda(), torch.Generator().manual_seed(1))
    assert torch.equal(on_gpu.cpu(), on_cpu)
    tokens, logps = sample_next(logits.cuda(), 1.0, 1.0, torch.Generator().manual_seed(1))
    assert tokens.device.type == logps.device.type == "cpu"
    assert torch.equal(tokens, on_cpu)
