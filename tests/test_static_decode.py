"""Issue 52's decode: the static-shape step per batch bucket (a CUDA graph on a GPU), the
check for finished rows every k token steps, the sampler's generator on the device, and the
decode weights built once per weight version."""

import copy
import json

import pytest
import torch

from rlscale.config import load_config
from rlscale.rlvr.config import RLVRConfig
from rlscale.rlvr.loop import train
from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.rollout.decoder import DecodeWeightsCache
from rlscale.rlvr.rollout.graphs import bucket_of
from rlscale.rlvr.rollout.sampler import SamplingParams, generate
from rlscale.rlvr.rollout.sampling import (
    CDF_MIN_VOCAB,
    device_generator,
    sample_tokens,
    top_p_filter,
)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")
_prompts = torch.Generator().manual_seed(0)
PROMPTS = [torch.randint(4, 100, (int(torch.randint(1, 9, (1,), generator=_prompts)),),
                         generator=_prompts).tolist() for _ in range(12)]


@pytest.fixture(scope="module")
def model():
    """A random tiny model whose matrices are scaled up 6x: at the usual init its greedy
    completions repeat one token, so no token ends rows at different steps."""
    net, _ = build_tiny_model("tiny", seed=3)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 2:
                p.mul_(6)
    return net.eval()


def rows(group: int = 2) -> list[list[int]]:
    """Each prompt `group` times, as a GRPO batch holds them (24 rows: bucket 32)."""
    return [p for p in PROMPTS for _ in range(group)]


def run(net, params, *, eos: int, seed: int = 0, **options):
    return generate(net, rows(), params, eos_token_id=eos, pad_token_id=0,
                    generator=torch.Generator().manual_seed(seed), **options)


def frequent_token(net, temperature: float = 0.0) -> int:
    """A token the completions first emit at many different steps: as EOS, rows stop at
    different times, so the batch compacts and changes bucket."""
    drawn = run(net, SamplingParams(max_new_tokens=24, temperature=temperature), eos=-1)
    ids = drawn.completion_ids

    def first_steps(token: int) -> int:
        hits = (ids == token).int()
        return len({int(row.argmax()) for row in hits if row.any()})

    return max(range(4, int(ids.max()) + 1), key=first_steps)


@torch.no_grad()
def full_forward_logits(net, prompt: list[int], completion: list[int]) -> torch.Tensor:
    logits = net(input_ids=torch.tensor([prompt + completion]), use_cache=False).logits[0]
    return logits[len(prompt) - 1: len(prompt) - 1 + len(completion)].float()


def test_buckets_are_powers_of_two_capped_at_the_cache_rows():
    assert [bucket_of(n, 64) for n in (1, 2, 3, 5, 17, 32, 33, 64)] == [1, 2, 4, 8, 32, 32,
                                                                         64, 64]
    assert bucket_of(33, 40) == 40


def test_the_static_step_decodes_the_full_forwards_greedy_tokens_across_buckets(model):
    eos = frequent_token(model)
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    static = run(model, params, eos=eos, static_step=True)
    eager = run(model, params, eos=eos)
    stops = static.lengths[[r == "stop" for r in static.finish_reasons]]
    assert len(set(stops.tolist())) >= 3  # rows finished at several steps: buckets changed
    assert torch.equal(static.completion_ids, eager.completion_ids)
    assert torch.equal(static.lengths, eager.lengths)
    for i, prompt in enumerate(rows()):
        n = int(static.lengths[i])
        completion = static.completion_ids[i, :n].tolist()
        expected = full_forward_logits(model, prompt, completion).argmax(-1)
        assert expected.tolist() == completion, i


def test_the_static_steps_sampled_log_probs_equal_the_full_forwards(model):
    eos = frequent_token(model, 0.8)
    rollout = run(model, SamplingParams(max_new_tokens=16, temperature=0.8), eos=eos, seed=4,
                  static_step=True)
    for i, prompt in enumerate(rows()):
        n = int(rollout.lengths[i])
        completion = rollout.completion_ids[i, :n].tolist()
        expected = (full_forward_logits(model, prompt, completion) / 0.8).log_softmax(-1)
        expected = expected.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
        # fp32, the cached path against one full forward: ~1e-5 apart on AVX-512 kernels
        assert torch.allclose(rollout.sampler_logprobs[i, :n], expected, atol=1e-4, rtol=0), i


def test_the_static_step_needs_a_model_the_decoder_supports(model):
    with pytest.raises(ValueError, match="static_step needs a model the fused decoder"):
        run(model, SamplingParams(max_new_tokens=4), eos=-1, static_step=True,
            fast_decode=False)


@pytest.mark.parametrize("every", [3, 5])
def test_checking_for_eos_every_k_steps_never_lets_a_token_past_eos(model, every):
    eos = frequent_token(model, 1.0)
    params = SamplingParams(max_new_tokens=20, temperature=1.0)
    rollout = run(model, params, eos=eos, seed=2, eos_check_every=every)
    ids, mask = rollout.completion_ids, rollout.mask
    assert "stop" in rollout.finish_reasons
    for i, reason in enumerate(rollout.finish_reasons):
        n = int(rollout.lengths[i])
        emitted = ids[i, :n].tolist()
        assert eos not in emitted[:-1], i           # nothing drawn after an EOS is kept
        assert (emitted[-1] == eos) == (reason == "stop"), i
        assert mask[i, :n].sum() == n and mask[i, n:].sum() == 0
        assert (ids[i, n:] == 0).all() and (rollout.sampler_logprobs[i, n:] == 0).all()
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    assert torch.equal(run(model, greedy, eos=eos, eos_check_every=every).completion_ids,
                       run(model, greedy, eos=eos).completion_ids)


def test_the_same_seed_draws_the_same_tokens_and_the_cpu_keeps_its_generator(model):
    cpu = torch.Generator().manual_seed(1)
    assert device_generator(cpu, torch.device("cpu")) is cpu
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    first = run(model, params, eos=-1, seed=9, eos_check_every=4)
    again = run(model, params, eos=-1, seed=9, eos_check_every=4)
    assert torch.equal(first.completion_ids, again.completion_ids)
    assert not torch.equal(first.completion_ids,
                           run(model, params, eos=-1, seed=10).completion_ids)


def draw_frequencies(device: str, vocab: int, temperature: float, top_p: float):
    """(sampled frequencies, the distribution sampled from, the draws) for 50,000 rows of
    one logit vector, drawn by `sample_tokens` with a generator on `device`."""
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(0)) * 2
    probs = top_p_filter(logits / temperature, top_p).softmax(-1).double()
    draws = 50_000
    generator = device_generator(torch.Generator().manual_seed(1), torch.device(device))
    chosen, logp = sample_tokens(logits.to(device).expand(draws, vocab), temperature, top_p,
                                 generator)
    assert chosen.device.type == logp.device.type == device
    assert torch.allclose(logp.cpu().double(), probs[chosen.cpu()].log(), atol=1e-5)
    return torch.bincount(chosen.cpu(), minlength=vocab).double(), probs, draws


def assert_frequencies_match(counts, probs, draws):
    expected = probs * draws
    sigma = (expected * (1 - probs)).sqrt()
    assert counts[probs == 0].sum() == 0                    # top-p's cut tokens never drawn
    assert ((counts - expected).abs() <= 5 * sigma + 1).all()


@pytest.mark.parametrize("vocab", [100, CDF_MIN_VOCAB + 300])
def test_sampled_frequencies_follow_the_distribution_sampled_from(vocab):
    assert_frequencies_match(*draw_frequencies("cpu", vocab, 0.8, 0.9))


@CUDA
@pytest.mark.parametrize("vocab", [100, CDF_MIN_VOCAB + 300])
def test_a_cuda_generator_draws_the_distribution_and_is_seeded(vocab):
    assert_frequencies_match(*draw_frequencies("cuda", vocab, 0.8, 0.9))
    one = device_generator(torch.Generator().manual_seed(5), torch.device("cuda"))
    two = device_generator(torch.Generator().manual_seed(5), torch.device("cuda"))
    assert one.device.type == "cuda"
    assert torch.equal(torch.rand(8, generator=one, device="cuda"),
                       torch.rand(8, generator=two, device="cuda"))


@CUDA
def test_cuda_graphs_decode_what_the_eager_step_decodes(model):
    net = copy.deepcopy(model).cuda()
    eos = frequent_token(model)
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    graphs = run(net, greedy, eos=eos, static_step=True, eos_check_every=4)
    eager = run(net, greedy, eos=eos, eos_check_every=1)
    assert torch.equal(graphs.completion_ids, eager.completion_ids)
    sampled = run(net, SamplingParams(max_new_tokens=16), eos=eos, seed=3, static_step=True)
    again = run(net, SamplingParams(max_new_tokens=16), eos=eos, seed=3, static_step=True)
    assert torch.equal(sampled.completion_ids, again.completion_ids)
    for i, prompt in enumerate(rows()):
        n = int(sampled.lengths[i])
        completion = sampled.completion_ids[i, :n].tolist()
        expected = full_forward_logits(model, prompt, completion).log_softmax(-1)
        expected = expected.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
        assert torch.allclose(sampled.sampler_logprobs[i, :n], expected, atol=1e-4), i


def test_decode_weights_are_built_once_per_weight_version(model):
    cache = DecodeWeightsCache()
    first = cache.get(model, 0)
    assert cache.get(model, 0) is first and cache.builds == 1
    assert cache.get(model, 1) is not first and cache.builds == 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cache.get(model, 1).dtype == torch.bfloat16 and cache.builds == 3
    norm = model.model.norm.weight
    norm.data = norm.data.clone()  # new tensors (a weight sync's `.data =`): built again
    cache.get(model, 1)
    assert cache.builds == 4


def test_a_run_logs_the_samplers_time_inside_the_collect(tmp_path, tiny_model_dir):
    train(load_config(RLVRConfig, None, [
        f"model.path={tiny_model_dir}", f"run_dir={tmp_path / 'run'}",
        "rollout.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=6",
        "rollout.static_decode=true", "rollout.eos_check_every=2", "train.steps=2",
        "eval.every=0", "checkpoint.every=0", "progress=false", "tensorboard=false"]))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    for row in map(json.loads, lines):
        assert 0 < row["time/generate_s"] <= row["time/collect_s"]


def test_the_models_own_forward_ignores_decode_weights_passed_in(model):
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    weights = DecodeWeightsCache().get(model, 0)
    forward = run(model, params, eos=-1, fast_decode=False)
    assert torch.equal(run(model, params, eos=-1, fast_decode=False,
                           decode_weights=weights).completion_ids, forward.completion_ids)
