"""vLLM behind the engine interface: greedy tokens as transformers', mu after temperature and top-p,
versions and weights switched between two steps.

Needs vLLM, which lives in a venv of its own: `make test-vllm` (builds it with `make install-vllm`,
in `$VLLM_VENV`, default `.venv-vllm`; CUDA: `make install-vllm VLLM_EXTRA=vllm`).
"""

import os
import sys
import time

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm runs these in its venv)")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from rlscale.rlvr.model import build_tiny_model  # noqa: E402
from rlscale.rlvr.rollout.sampler import _top_p_filter  # noqa: E402
from rlscale.rlvr.rollout.types import EngineSampling, GenerationRequest  # noqa: E402
from rlscale.rlvr.rollout.vllm_engine import VLLMEngine, VLLMNotInstalled  # noqa: E402
from stub_tools import EveryNthToken  # noqa: E402

PROMPTS = [(1, 20, 21, 22), (1, 30), (1, 40, 41, 42, 43, 44, 45), (1, 50, 51)]
# Eager mode: torch.compile would add ~40 s to every engine start on these CPUs.
EAGER = {"enforce_eager": True}


def engine(path, sampling, slots=4, **kwargs) -> VLLMEngine:
    return VLLMEngine(path, sampling, max_slots=slots, seed=0, engine_kwargs=EAGER,
                      **kwargs)


def add_all(eng, prompts, max_new_tokens, first_id=0):
    for i, prompt in enumerate(prompts):
        eng.add_request(GenerationRequest(first_id + i, prompt, max_new_tokens))


def reference_logprobs(model, completion, sampling: EngineSampling) -> torch.Tensor:
    """log mu of each completion token: an fp32 forward, temperature, top-p, renormalised."""
    ids = torch.tensor([list(completion.prompt_ids) + completion.token_ids])
    start = len(completion.prompt_ids)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, start - 1:-1].float()
    logp = _top_p_filter(logits / sampling.temperature, sampling.top_p).log_softmax(-1)
    return logp.gather(-1, ids[0, start:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def greedy_reference(model, prompt, max_new_tokens, eos_token_id=2) -> list[int]:
    """Argmax of a full fp32 forward per token. Not the project's engine or sampler: they
    use transformers >= 5.2x's `out.cache`, and vLLM 0.32 pins transformers < 5.20."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            if ids[-1] == eos_token_id:
                break
    return ids[len(prompt):]


def test_greedy_tokens_match_a_transformers_forward(tiny_model_dir, hf_model):
    with engine(tiny_model_dir, EngineSampling(temperature=0.0)) as eng:
        add_all(eng, PROMPTS, 12)
        done = {c.request_id: c for c in eng.run()}
    assert sorted(done) == list(range(len(PROMPTS)))
    for rid, completion in done.items():
        expected = greedy_reference(hf_model, PROMPTS[rid], 12)
        assert completion.token_ids == expected
        assert completion.finish_reason == ("stop" if expected[-1] == 2 else "length")
        assert completion.logprobs == [0.0] * len(completion)  # a point mass
        assert completion.versions == [0] * len(completion)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_logprobs_are_mu_of_the_distribution_sampled_from(tiny_model_dir, hf_model, top_p):
    sampling = EngineSampling(temperature=0.7, top_p=top_p)
    with engine(tiny_model_dir, sampling) as eng:
        add_all(eng, PROMPTS, 16)
        done = eng.run()
    assert len(done) == len(PROMPTS)
    for completion in done:
        expected = reference_logprobs(hf_model, completion, sampling)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)
        if top_p < 1:  # the check can tell the modes apart: before top-p mass is lower
            unfiltered = reference_logprobs(hf_model, completion,
                                            EngineSampling(sampling.temperature, 1.0))
            assert (expected - unfiltered).max() > 1e-3


def test_load_weights_between_steps(tiny_model_dir, hf_model, caplog):
    sampling = EngineSampling(temperature=1.0, top_p=0.9, ignore_eos=True)
    new_model, _ = build_tiny_model("tiny", seed=1)
    new_model.eval()
    with engine(tiny_model_dir, sampling) as eng:
        add_all(eng, PROMPTS[:3], 12)
        for _ in range(4):  # prefill + 3 decode steps: 4 tokens each, none finished
            assert eng.step() == []
        with caplog.at_level("WARNING"):
            eng.load_weights(new_model.state_dict(), version=1)
        # the rotary table is derived, not loaded: its benign warning is gone, others stay
        assert "Failed to load weights" not in caplog.text
        assert eng.version == 1
        # Same prompt as request 0: a prefix cached under the old weights must not be reused.
        eng.add_request(GenerationRequest(10, PROMPTS[0], 6))
        done = {c.request_id: c for c in eng.run()}
    assert sorted(done) == [0, 1, 2, 10]
    assert done[10].versions == [1] * 6
    for rid in (0, 1, 2):
        assert done[rid].versions == [0] * 4 + [1] * 8
    for completion in done.values():
        versions = torch.tensor(completion.versions)
        got = torch.tensor(completion.logprobs)
        old = reference_logprobs(hf_model, completion, sampling)
        new = reference_logprobs(new_model, completion, sampling)
        expected = torch.where(versions == 0, old, new)
        assert torch.allclose(got, expected, atol=1e-4, rtol=0)
        # ... and the new weights really differ here (the tied-embedding fix took effect).
        assert ((got - old).abs()[versions == 1] > 1e-3).any()


def test_load_weights_keeping_the_running_cache(tiny_model_dir):
    """recompute_cache_on_update=False: running requests keep their old-weight KV (so their
    later tokens match neither model exactly), but no new request reuses an old prefix."""
    sampling = EngineSampling(temperature=1.0, ignore_eos=True)
    new_model, _ = build_tiny_model("tiny", seed=1)
    new_model.eval()
    with engine(tiny_model_dir, sampling, recompute_cache_on_update=False) as eng:
        add_all(eng, PROMPTS[:2], 8)
        for _ in range(3):
            eng.step()
        eng.load_weights(new_model.state_dict(), version=5)
        eng.add_request(GenerationRequest(10, PROMPTS[0], 6))
        done = {c.request_id: c for c in eng.run()}
    assert done[0].versions == done[1].versions == [0] * 3 + [5] * 5
    fresh = done[10]
    assert fresh.versions == [5] * 6
    expected = reference_logprobs(new_model, fresh, sampling)
    assert torch.allclose(torch.tensor(fresh.logprobs), expected, atol=1e-4, rtol=0)


def test_abort_all_and_close_leave_nothing(tiny_model_dir):
    before = {n for n in os.listdir("/dev/shm") if n.startswith(("psm_", "rlscale-vllm-"))}
    eng = engine(tiny_model_dir, EngineSampling(ignore_eos=True))
    add_all(eng, PROMPTS, 50)
    eng.step()
    assert eng.has_unfinished()
    assert sorted(eng.abort_all()) == list(range(len(PROMPTS)))
    assert not eng.has_unfinished() and eng.step() == []
    model, _ = build_tiny_model("tiny", seed=2)
    eng.load_weights(model.state_dict(), version=3)
    add_all(eng, PROMPTS[:1], 3, first_id=100)
    (completion,) = eng.run()
    assert completion.request_id == 100 and completion.versions == [3] * 3
    eng.close()
    after = {n for n in os.listdir("/dev/shm") if n.startswith(("psm_", "rlscale-vllm-"))}
    assert after <= before


RESULT = [20, 21, 22]   # a tool's result, as token ids


def test_a_tool_call_leaves_vllm_and_resumes_with_the_result_in_its_context(tiny_model_dir,
                                                                          hf_model):
    """Greedy: after the call, the tokens are the model's over the whole context (prompt,
    tokens, result); the result is masked, with no log-prob of the policy's."""
    tools = EveryNthToken(RESULT, after=3, latency_s=0.05)
    with engine(tiny_model_dir, EngineSampling(temperature=0.0), tools=tools) as eng:
        add_all(eng, PROMPTS, 12)
        done = {c.request_id: c for c in eng.run()}
        assert not eng.parked and not eng.has_unfinished()
    compared = 0
    for rid, c in done.items():
        if len(c) <= 3:
            continue  # ended (EOS) before its call
        assert tools.calls[rid] == 1 and c.tool_calls == 1
        assert c.token_ids[3:6] == RESULT
        assert c.tool_mask == [0] * 3 + [1] * 3 + [0] * (len(c) - 6)
        assert c.logprobs == [0.0] * len(c)
        context = tuple(PROMPTS[rid]) + tuple(c.token_ids[:6])
        expected = greedy_reference(hf_model, context, len(c) - 6)
        assert c.token_ids[6:] == expected
        compared += 1
    assert compared >= 3


def test_sampled_tokens_after_a_call_carry_mu_over_the_full_context(tiny_model_dir, hf_model):
    sampling = EngineSampling(temperature=0.8, ignore_eos=True)
    tools = EveryNthToken(RESULT, after=2, max_calls=2)
    with engine(tiny_model_dir, sampling, tools=tools) as eng:
        add_all(eng, PROMPTS, 12)
        done = eng.run()
    assert len(done) == len(PROMPTS)
    for c in done:
        assert c.tool_calls == 2 and len(c) == 12
        tool = torch.tensor(c.tool_mask, dtype=torch.bool)
        expected = reference_logprobs(hf_model, c, sampling)
        assert torch.allclose(torch.tensor(c.logprobs)[~tool], expected[~tool], atol=1e-4,
                              rtol=0)


def test_a_parked_request_gives_its_place_to_others_and_abort_drops_it(tiny_model_dir):
    """One sequence slot: while request 0 waits on a slow tool, request 1 runs to its end."""
    tools = EveryNthToken(RESULT, after=2, latency_s=1.0)
    with engine(tiny_model_dir, EngineSampling(ignore_eos=True), tools=tools,
                slots=1) as eng:
        eng.add_request(GenerationRequest(0, PROMPTS[0], 8))
        eng.add_request(GenerationRequest(1, PROMPTS[1], 2))
        order = []
        while eng.has_unfinished():
            order += [c.request_id for c in eng.step()]
        assert order == [1, 0]
        add_all(eng, PROMPTS[:2], 8, first_id=10)
        while not eng.parked:
            eng.step()
        assert sorted(eng.abort_all()) == [10, 11]
        assert not eng.has_unfinished() and not eng.parked
        time.sleep(1.2)  # the parked request's result comes back: ignored
        assert eng.step() == []


def test_missing_vllm_names_the_extra(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(VLLMNotInstalled, match=r"pip install 'rlscale\[vllm\]'"):
        VLLMEngine(tiny_model_dir, EngineSampling(), max_slots=1, seed=0)
