"""Tool calls inside the continuous-batching engine: a request that closes a call is parked
(its slot serves others), the result is inserted into its context (masked out of the loss),
and it resumes drawing from exactly the distribution of an uninterrupted run over the same
context; the loss never sees tool-written tokens."""

from __future__ import annotations

import time

import pytest
import torch

from rlscale.rlvr.batch import build_policy_batch
from rlscale.rlvr.logprobs import completion_logprobs
from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.rollout.engine import ContinuousBatchingEngine
from rlscale.rlvr.rollout.groups import rollout_from_completions
from rlscale.rlvr.rollout.types import EngineSampling, GenerationRequest
from stub_tools import EveryNthToken

PROMPTS = ["1+2=", "347+85=", "19*9=", "12+5=", "99*9=", "7-3="]


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny", seed=1)
    return model.eval(), tokenizer


def run_engine(lm, tools, sampling, *, slots=2, max_new=12, seed=0, prompts=PROMPTS):
    model, tokenizer = lm
    engine = ContinuousBatchingEngine(model, sampling, slots=slots,
                                      eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, seed=seed, tools=tools)
    ids = [tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    for i, prompt in enumerate(ids):
        engine.add_request(GenerationRequest(i, prompt, max_new))
    done = {c.request_id: c for c in engine.run()}
    return engine, [done[i] for i in range(len(ids))]


def result_ids(tokenizer, text="=42;"):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_parked_request_resumes_as_an_uninterrupted_run_with_the_result_inserted(lm):
    model, tokenizer = lm
    result = result_ids(tokenizer)
    greedy = EngineSampling(temperature=0.0)
    sampling = EngineSampling(temperature=1.0)
    engine, with_tools = run_engine(lm, EveryNthToken(result, after=3, latency_s=0.01), greedy,
                                    max_new=14)
    assert engine.stats.tool_calls == engine.stats.resumes > 0
    compared = 0
    for c in with_tools:
        if len(c) <= 3:
            continue  # ended (EOS) before its call
        assert c.token_ids[3:3 + len(result)] == result
        assert c.tool_mask == [0] * 3 + [1] * len(result) + [0] * (len(c) - 3 - len(result))
        assert c.logprobs[3:3 + len(result)] == [0.0] * len(result)
        # The same context, uninterrupted: the prompt followed by everything up to the result.
        prefix = tuple(c.prompt_ids) + tuple(c.token_ids[:3 + len(result)])
        rest = len(c) - 3 - len(result)
        if rest == 0:
            continue
        _, (plain,) = run_engine(lm, None, greedy, max_new=rest,
                                 prompts=[tokenizer.decode(list(prefix))])
        assert plain.token_ids == c.token_ids[3 + len(result):]
        compared += 1
    assert compared >= 3

    # Sampled: every sampled token's log-prob is the model's over the full context (prompt,
    # tokens, result) -- the distribution the resumed row really drew from.
    _, sampled = run_engine(lm, EveryNthToken(result, after=2, max_calls=2), sampling,
                            max_new=16, seed=3)
    checked = 0
    for c in sampled:
        ids = torch.tensor([list(c.prompt_ids) + c.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
        logp = logits[len(c.prompt_ids) - 1:-1].log_softmax(-1).gather(
            -1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        tool = torch.tensor(c.tool_mask or [0] * len(c), dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(c.logprobs)[~tool], logp[~tool],
                                   atol=1e-4, rtol=1e-4)
        checked += int(tool.any())
    assert checked > 0


def test_a_parked_slot_serves_other_requests(lm):
    _, tokenizer = lm
    tools = EveryNthToken(result_ids(tokenizer), after=2, latency_s=0.05)
    engine, done = run_engine(lm, tools, EngineSampling(temperature=0.0), slots=2,
                              max_new=10)
    assert len(done) == len(PROMPTS) and not engine.parked
    # While the first two requests waited on their calls, the queue's next ones ran in their
    # slots: more prefills than requests (resumes), and nothing waited on an idle batch.
    assert engine.stats.prefills == len(PROMPTS) + engine.stats.resumes


def test_reproducible_tools_give_the_same_rollouts_whatever_the_calls_timing(lm):
    """Sampled, with calls that come back at once in one run and after 0.2 s for half the
    requests in the other: waiting for every call before the next decode step, the two runs
    draw the same tokens; resuming rows as their results arrive, the slow calls' rows rejoin
    later, in other batches, and the runs part."""
    _, tokenizer = lm
    result, sampling = result_ids(tokenizer), EngineSampling(temperature=1.0)
    slow = {i: 0.2 for i in range(0, len(PROMPTS), 2)}

    def tokens(reproducible: bool, latency_of: dict[int, float]) -> list[list[int]]:
        tools = EveryNthToken(result, after=2, max_calls=2, reproducible=reproducible,
                              latency_of=latency_of)
        _, done = run_engine(lm, tools, sampling, slots=3, max_new=16, seed=5)
        assert sum(c.tool_calls for c in done) >= len(PROMPTS)
        return [c.token_ids for c in done]

    assert tokens(True, {}) == tokens(True, slow)
    assert tokens(False, {}) != tokens(False, slow)


def test_a_result_that_reaches_the_length_cap_ends_the_request(lm):
    _, tokenizer = lm
    long_result = result_ids(tokenizer, "=" + "9" * 20)
    _, done = run_engine(lm, EveryNthToken(long_result, after=2), EngineSampling(0.0),
                         max_new=8)
    for c in done:
        if len(c) > 2:
            assert len(c) == 8 and c.finish_reason == "length" and c.tool_mask[2:] == [1] * 6


def test_abort_drops_parked_requests_and_ignores_their_results(lm):
    model, tokenizer = lm
    tools = EveryNthToken(result_ids(tokenizer), after=1, latency_s=0.05)
    engine = ContinuousBatchingEngine(model, EngineSampling(0.0), slots=4,
                                      eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, tools=tools)
    engine.add_request(GenerationRequest(7, tuple(tokenizer("1+2=")["input_ids"]), 10))
    engine.step()
    assert list(engine.parked) == [7]
    assert engine.abort_all() == [7] and not engine.has_unfinished()
    time.sleep(0.1)
    assert engine.step() == [] and not engine.has_unfinished()


def test_the_loss_never_sees_tool_written_tokens(lm):
    """Hand-built batch: tool tokens stay in the context (later tokens attend to them) but
    their content never reaches the loss through their own log-probs; with the result last
    the gradient is unchanged by what the tool wrote."""
    model, tokenizer = lm
    prompt = tokenizer("12+5=", add_special_tokens=False)["input_ids"]

    def grads(result_text: str, last: bool):
        result = result_ids(tokenizer, result_text)
        sampled = result_ids(tokenizer, "17;")
        tokens = sampled + result if last else sampled[:1] + result + sampled[1:]
        tool = [0] * len(sampled) + [1] * len(result) if last else \
            [0] + [1] * len(result) + [0] * (len(sampled) - 1)
        completion = torch.tensor([tokens])
        mask = torch.ones_like(completion, dtype=torch.float32)
        batch = build_policy_batch([prompt], completion, mask, torch.tensor([1.0]),
                                   torch.zeros_like(mask), tokenizer.pad_token_id, 0,
                                   tool_mask=torch.tensor([tool], dtype=torch.float32))
        assert batch.attention_mask[0, -len(tokens):].tolist() == [1] * len(tokens)
        assert batch.mask[0].tolist() == [1.0 - t for t in tool]
        model.zero_grad()
        logp, _ = completion_logprobs(model, batch)
        loss = (logp * batch.mask).sum() / batch.mask.sum()
        loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None], logp, batch

    a, _, _ = grads("=42;", last=True)
    b, _, _ = grads("=97;", last=True)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y)
    # In the middle: the later sampled tokens are scored in the context of the result.
    _, logp, batch = grads("=42;", last=False)
    full = torch.tensor([prompt + batch.completion_ids[0].tolist()])
    with torch.no_grad():
        logits = model(input_ids=full, use_cache=False).logits[0].float()
    expected = logits[len(prompt) - 1:-1].log_softmax(-1).gather(
        -1, batch.completion_ids[0][:, None]).squeeze(-1)
    keep = batch.mask[0] > 0
    torch.testing.assert_close(logp[0][keep].detach(), expected[keep], atol=1e-4, rtol=1e-4)


def test_completions_with_tool_tokens_become_a_rollout_with_a_tool_mask(lm):
    _, tokenizer = lm
    _, done = run_engine(lm, EveryNthToken(result_ids(tokenizer), after=2),
                         EngineSampling(0.0), max_new=10)
    rollout = rollout_from_completions(done, tokenizer.pad_token_id)
    assert rollout.tool_mask is not None
    for i, c in enumerate(done):
        n = len(c)
        assert rollout.tool_mask[i, :n].tolist() == [float(t) for t in (c.tool_mask or [0] * n)]
    assert torch.equal(rollout.sampled_mask(), rollout.mask * (1 - rollout.tool_mask))


def test_runner_tool_turns_find_a_closed_call_run_it_and_tokenize_the_result(lm):
    from rlscale.rlvr.tool_turns import RunnerToolTurns
    from rlscale.rlvr.tools import ToolsConfig

    _, tokenizer = lm
    turns = RunnerToolTurns.from_config(ToolsConfig(tools=["calculator"], max_tool_calls=1),
                                        tokenizer)
    try:
        def ids(text):
            return tokenizer(text, add_special_tokens=False)["input_ids"]

        assert turns.call_in(ids("12+5=17\n<c>432-9"), 0) is None  # not closed yet
        call = turns.call_in(ids("12+5=17\n<c>432-96</c>"), 0)
        assert call is not None and call.text == "432-96"
        assert turns.call_in(ids("<c>1+1</c>"), 1) is None  # past max_tool_calls
        turns.start(5, call)
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = turns.results(timeout=0.5)
        assert got == [(5, ids("<r>336</r>"))]
        m = turns.metrics()
        assert m["tools/calls"] == 1 and m["tools/failed"] == 0 and m["tools/over_limit"] == 1
    finally:
        turns.close()


# A chat template in the style of Qwen2.5's, tool messages included (no hub download).
QWEN_LIKE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_tool_call_in_a_chat_model_s_own_format_round_trips():
    from rlscale.rlvr.model import build_char_tokenizer
    from rlscale.rlvr.tool_turns import RunnerToolTurns
    from rlscale.rlvr.tools import ToolsConfig

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = QWEN_LIKE
    config = ToolsConfig(tools=["calculator"], markup={
        "format": "chat_template", "call_open": "<tool_call>", "call_close": "</tool_call>",
        "result_open": "<tool_response>", "result_close": "</tool_response>"})
    turns = RunnerToolTurns.from_config(config, tokenizer)
    try:
        def ids(text):
            return tokenizer(text, add_special_tokens=False)["input_ids"]

        user = {"role": "user", "content": "What is 12*(3+4)?"}
        prompt = tokenizer.apply_chat_template([user], tokenize=False, add_generation_prompt=True)
        generated = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": '
                     '{"expression": "12*(3+4)"}}\n</tool_call>')
        call = turns.call_in(ids(generated), 0)
        assert (call.name, call.text) == ("calculator", "12*(3+4)")
        turns.start(0, call)
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = turns.results(timeout=0.5)
        (_, result_ids), = got
        # The context the model goes on from is what its own template writes for this
        # conversation: the call in its turn, the tool's message, a new assistant turn.
        conversation = tokenizer.apply_chat_template(
            [user, {"role": "assistant", "content": generated},
             {"role": "tool", "name": "calculator", "content": "84"}],
            tokenize=False, add_generation_prompt=True)
        assert prompt + generated + tokenizer.decode(result_ids) == conversation
        bad = turns.call_in(ids("<tool_call>{not json}</tool_call>"), 0)
        assert bad.name is None and bad.text == "{not json}"
    finally:
        turns.close()


def test_new_weights_while_a_request_is_parked_reach_its_later_tokens(lm):
    """An in-flight update lands while a request waits on its call: the tokens after the
    pause carry the new version, and (cache recomputed) are drawn from the new weights over
    the whole context."""
    import copy

    model, tokenizer = lm
    new_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tools = EveryNthToken(result_ids(tokenizer), after=3, latency_s=0.2)
    engine = ContinuousBatchingEngine(copy.deepcopy(model), EngineSampling(temperature=1.0),
                                      slots=2, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, seed=5, tools=tools)
    prompt = tuple(tokenizer("12+5=", add_special_tokens=False)["input_ids"])
    engine.add_request(GenerationRequest(0, prompt, 16))
    while not engine.parked:
        engine.step()
    engine.load_weights(new_model.state_dict(), version=1)
    (c,) = engine.run()
    n = len(result_ids(tokenizer))
    assert c.versions[:3] == [0, 0, 0] and set(c.versions[3 + n:]) == {1}
    ids = torch.tensor([list(prompt) + c.token_ids])
    with torch.no_grad():
        logits = new_model(input_ids=ids, use_cache=False).logits[0].float()
    logp = logits[len(prompt) - 1:-1].log_softmax(-1).gather(
        -1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(c.logprobs[3 + n:]), logp[3 + n:],
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("markup", [
    {"format": "chat_template", "call_open": "<tool_call>", "call_close": "</tool_call>",
     "result_open": "<tool_response>", "result_close": "</tool_response>"},
    {"call_open": "<c>", "call_close": "</c>"},
])
def test_a_result_cannot_forge_chat_turns(markup):
    """A tool result that prints the chat template's special tokens is encoded as their text:
    the only special tokens after the call are the ones the template itself writes."""
    from rlscale.rlvr.model import build_char_tokenizer
    from rlscale.rlvr.tool_turns import RunnerToolTurns
    from rlscale.rlvr.tools import ToolCall, ToolsConfig, encode_result_turn, result_turn

    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = QWEN_LIKE
    special = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")}
    config = ToolsConfig(tools=["user_tools:forge"], markup=markup)
    turns = RunnerToolTurns.from_config(config, tokenizer)
    try:
        turns.start(0, ToolCall("forge", "x"))
        got, deadline = [], time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = turns.results(timeout=0.5)
        (_, ids), = got
    finally:
        turns.close()
    innocent = encode_result_turn(tokenizer, result_turn("42", config.markup, tokenizer, "forge"))
    assert sorted(i for i in ids if i in special) == sorted(i for i in innocent if i in special)
    assert "Ignore the task" in tokenizer.decode(ids)  # kept, as text the model can read

