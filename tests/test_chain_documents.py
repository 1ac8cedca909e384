"""The emergence bases' pretraining text (docs/emergence.md): stand-alone facts and check
primers in the trace's grammar that never hold a multi-step solution (checked by a parser
that does find one in every demonstrated trace), and the counters RL's behaviour is read by:
true and false alarms, redos, worked lines and lines that work the prompt's own chain."""

import random
import re

import pytest
import torch

from chains import chain
from rlscale.rlvr.config import SFTConfig
from rlscale.rlvr.distill import build_demonstrations
from rlscale.rlvr.emergence import by_terms, line_use, over_terms
from rlscale.rlvr.evaluate import EvalResult
from rlscale.rlvr.model import build_char_tokenizer
from rlscale.rlvr.tasks import make_task
from rlscale.rlvr.tasks.chain_documents import DOCUMENT_KINDS, multi_step_solution
from rlscale.rlvr.tasks.long_arithmetic import chained_lines, count_behaviour

TASK = make_task("long_arithmetic")


@pytest.mark.parametrize(("text", "multi"), [
    ("47+385=432\n432-96=336", True),                       # a continued running total
    ("47+385=432\n<a>1046</a>", True),                       # an intermediate result
    ("47+385=432\n<a>432</a>", False),                       # one line, the whole chain
    ("47+385-96+710=1046\n<a>1046</a>", False),              # the same for four terms
    ("47+385=432 ?432-385=47 ok\n432-96=336 ?336+96=432 ok", True),
    ("<a>1046</a>", False),                                  # the answer alone
    ("47+385=432\n663+65=728\n9+68=77", False),              # unrelated facts
    ("432-96=346 ?346+96=442 no\n432-96=336 ?336+96=432 ok", False),  # a redo
    ("47+385-96=336", False),                                # one combined line
])
def test_the_parser_finds_multi_step_solutions(text, multi):
    assert multi_step_solution(text) is multi


def test_no_document_holds_a_multi_step_solution_and_every_trace_does():
    rng = random.Random(0)
    for kind in DOCUMENT_KINDS:
        documents = [TASK.document(kind, rng) for _ in range(5000)]
        assert not any(multi_step_solution(d) for d in documents), kind
        assert all(count_behaviour(d).other_lines == 0 for d in documents), kind
        assert not any("<a>" in d for d in documents)
    primers = [count_behaviour(TASK.document("primers", rng)) for _ in range(5000)]
    assert all(c.checks == c.steps for c in primers)
    assert sum(c.true_alarms for c in primers) == sum(c.redos for c in primers) > 200
    assert sum(c.missed_slips + c.false_alarms for c in primers) == 0
    # the parser finds the solutions the reasoning demonstrations write (chains of 3+ terms
    # worked a line an operation, or two), and none in one line that works the whole chain
    examples = [ex for ex in (TASK.sample("train", rng) for _ in range(400))
                if ex.meta["terms"] >= 3 and all(term for _, term in ex.meta["ops"])]
    # (a chain that adds 0 twice, `811+0=811` twice, has no result that changes)
    for strategy in ("plain", "careful", "combine"):
        traces = [TASK.demonstrate(ex, strategy, rng) for ex in examples]
        assert all(multi_step_solution(t) for t in traces if t.count("\n") >= 2), strategy
    whole = [TASK.demonstrate(ex, "whole", random.Random(1)) for ex in examples]
    assert all(t.count("\n") == 1 for t in whole)
    assert not any(multi_step_solution(t) for t in whole)


def test_the_corpus_mixes_documents_and_answer_only_demonstrations():
    cfg = SFTConfig.model_validate({
        "init_preset": "tiny", "task": {"name": "long_arithmetic"},
        "data": {"examples": 4000, "answer_only": True,
                 "documents": {"facts": 0.4, "primers": 0.2}}})
    tokenizer = build_char_tokenizer()
    pairs = build_demonstrations(cfg, tokenizer)
    documents = [c for p, c in pairs if p == [tokenizer.bos_token_id]]
    assert 0.55 < len(documents) / len(pairs) < 0.65
    texts = [tokenizer.decode(c[:-1]) for _, c in pairs]
    assert not any(multi_step_solution(tokenizer.decode(p) + "\n" + t) for (p, _), t in
                   zip(pairs, texts, strict=True) if p != [tokenizer.bos_token_id])
    answers = [t for (p, _), t in zip(pairs, texts, strict=True) if p != [tokenizer.bos_token_id]]
    assert all(re.fullmatch(r"<a>[0-9]+</a>", t) for t in answers)


@pytest.mark.parametrize(("documents", "message"), [
    ({"essays": 0.1}, "has no 'essays' documents"),
    ({"facts": 0.8, "primers": 0.4}, "sum to at most 1"),
])
def test_bad_document_shares_are_one_line_errors(documents, message):
    cfg = SFTConfig.model_validate({"init_preset": "tiny", "task": {"name": "long_arithmetic"},
                                    "data": {"examples": 10, "documents": documents}})
    with pytest.raises(ValueError, match=message):
        build_demonstrations(cfg, build_char_tokenizer())
    with pytest.raises(ValueError, match="has no 'facts' documents"):
        build_demonstrations(SFTConfig.model_validate(
            {"init_preset": "tiny", "task": {"name": "arithmetic"},
             "data": {"examples": 10, "documents": {"facts": 0.5}}}), build_char_tokenizer())


def test_alarm_redo_and_chain_counters_on_hand_made_traces():
    ex = chain("47+385-96+710=")
    caught = ("47+385=432 ?432-385=47 ok\n432-96=346 ?346+96=442 no\n"
              "432-96=336 ?336+96=432 ok\n336+710=1046 ?1046-710=336 ok\n<a>1046</a>")
    c = count_behaviour(caught)
    assert (c.true_alarms, c.false_alarms, c.missed_slips, c.redos, c.corrected) == \
        (1, 0, 0, 1, 1)
    assert chained_lines(caught, ex) == 3
    false_alarm = "47+385=432 ?432-385=46 no\n47+385=432 ?432-385=47 ok\n<a>432</a>"
    c = count_behaviour(false_alarm)
    assert (c.true_alarms, c.false_alarms, c.redos, c.corrected) == (0, 1, 1, 0)
    # a caught slip redone wrong, then right: one correction (of the second wrong line)
    c = count_behaviour("5+5=11 ?11-5=6 no\n5+5=12 ?12-5=7 no\n5+5=10 ?10-5=5 ok\n<a>10</a>")
    assert (c.wrong_steps, c.true_alarms, c.redos, c.corrected) == (2, 2, 2, 1)
    # a "no" without the step written again is no redo; a slip passed with "ok" is missed
    c = count_behaviour("5+5=11 ?11-5=6 no\n6+1=7\n<a>7</a>")
    assert (c.true_alarms, c.redos) == (1, 0)
    # facts unrelated to the prompt are worked lines but not the chain's
    junk = "663+65=728\n9+68=77\n<a>1046</a>"
    metrics = TASK.behaviour(junk, ex)
    assert metrics["intermediate"] == 1.0 and metrics["chained_lines"] == 0
    assert TASK.behaviour("<a>1046</a>", ex)["intermediate"] == 0.0
    skipped = "47+385=432\n336+710=1046\n<a>1046</a>"  # the second line skips -96
    assert chained_lines(skipped, ex) == 1


class LastNumberModel(torch.nn.Module):
    """A stand-in LM whose greedy answer is the last number written before `<a>` (0 when
    there is none after the prompt's `=`): a model that can use the lines it is handed."""

    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def generate(self, ids, attention_mask, max_new_tokens, do_sample, pad_token_id):
        text = self.tokenizer.decode(ids[0])
        after = text.split("=", 1)[1]
        numbers = re.findall(r"[0-9]+", after)
        answer = numbers[-1] if numbers else "0"
        new = self.tokenizer(answer + "</a>", add_special_tokens=False)["input_ids"]
        return torch.cat([ids, torch.tensor([new])], dim=1)


def test_line_use_tells_a_model_that_uses_lines_from_one_that_does_not():
    tokenizer = build_char_tokenizer()
    examples = [chain("47+385-96+710="), chain("5+6+7="), chain("90-9-80=")]
    use = line_use(LastNumberModel(tokenizer), tokenizer, TASK, examples)
    assert (use.prompts, use.alone, use.after_lines, use.copies_last) == (3, 0.0, 1.0, 1.0)


def test_by_terms_reads_pass_lines_and_length_per_chain_length():
    examples = [chain("1+2="), chain("47+385-96+710=")]
    texts = ["<a>3</a>", "<a>4</a>",                       # 2 terms: one right, no lines
             "47+385=432\n432-96=336\n336+710=1046\n<a>1046</a>", "<a>1</a>"]
    result = EvalResult(pass_at={1: 0.5}, n=2, samples=2, mean_length=0.0, seconds=0.0,
                        per_prompt_correct=[1, 1], texts=texts, examples=examples)
    table = by_terms(TASK, result)
    assert table[2] == {"pass@1": 0.5, "intermediate": 0.0, "chained_lines": 0.0,
                        "characters": 8.0}
    assert table[4]["pass@1"] == 0.5 and table[4]["intermediate"] == 0.5
    assert table[4]["chained_lines"] == 1.5
    assert over_terms(table, 2, 4)["pass@1"] == 0.5
    with pytest.raises(ValueError, match="no completions of chains of 5-6 terms"):
        over_terms(table, 5, 6)
