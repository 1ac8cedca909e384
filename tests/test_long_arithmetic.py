"""The reasoning task `long_arithmetic`: a strict answer-tag verifier that runs nothing,
disjoint splits with an `ood` defined by a rule (a digit no train/test term has), a
deterministic demonstrator with the stated share of imperfect traces, and behaviour counters."""

import builtins
import os
import random
import re
import subprocess
import time
from collections import Counter

import pytest

from chains import chain
from rlscale.rlvr.tasks import TaskOptionError, examples, make_task, split_of
from rlscale.rlvr.tasks.long_arithmetic import (
    FORBIDDEN_DIGIT,
    STRATEGIES,
    count_behaviour,
    parse_answer,
)
from rlscale.rlvr.trace_stats import behaviour_means, by_difficulty, length_by_outcome

TASK = make_task("long_arithmetic")


EX = chain("47+385-96+710=")  # 1046


@pytest.mark.parametrize(("text", "score"), [
    ("<a>1046</a>", 1.0),
    ("47+385=432\n432-96=336\n336+710=1046\n<a>1046</a>", 1.0),
    ("free text the model chose to write\n<a>1046</a>\n", 1.0),
    ("<a>1045</a>", 0.0),                      # wrong
    ("1046", 0.0),                             # no tag
    ("<a>1046</a> and more", 0.0),             # the tag must end the completion
    ("<a>999</a>\n<a>1046</a>", 0.0),          # two answers: no hedging
    ("<a>01046</a>", 1.0),                     # the integer, as written
    ("<a>1046", 0.0), ("<a></a>", 0.0), ("<a>-1046</a>", 0.0), ("<a>1e3</a>", 0.0),
    ("<a>１０４６</a>", 0.0),                    # other scripts' digits are not ASCII digits
    ("", 0.0),
])
def test_verifier_on_hand_made_answers(text, score):
    assert TASK.verify(text, EX) == score


def test_verifier_runs_nothing_and_is_fast(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the verifier must not run code")

    for obj, attr in ((builtins, "eval"), (builtins, "exec"), (builtins, "open"),
                      (os, "system"), (subprocess, "run"), (subprocess, "Popen")):
        monkeypatch.setattr(obj, attr, forbidden)
    hostile = ["__import__('os').system('touch PWNED')\n<a>1046</a>",
               "1+" * 50_000 + "1=2\n<a>1046</a>", "<a>" * 10_000 + "1046</a>",
               "9" * 100_000, "<a>" + "1" * 10_000 + "</a>"]
    start = time.perf_counter()
    scores = [TASK.verify(text, EX) for text in hostile]
    counted = [count_behaviour(text) for text in hostile]
    assert time.perf_counter() - start < 1.0
    assert scores == [1.0, 1.0, 0.0, 0.0, 0.0]  # free text is allowed; only the tag counts
    assert counted[1].combined == 1 and counted[1].wrong_steps == 1  # 1+1+...+1 is not 2


def test_splits_are_disjoint_and_ood_differs_by_its_rule():
    n = 3000
    train = {ex.prompt for ex in examples(TASK, "train", 0, n, unique=False)}
    test = {ex.prompt for ex in examples(TASK, "test", 0, n // 3, unique=False)}
    ood = {ex.prompt for ex in examples(TASK, "ood", 0, n // 3)}
    assert len(train) > 2500 and len(test) > 900 and len(ood) == n // 3
    assert not train & test and not ood & (train | test)
    assert all(split_of(p, TASK.test_share) == "train" for p in train)
    assert all(split_of(p, TASK.test_share) == "test" for p in test)

    def terms(prompt):
        return re.findall(r"[0-9]+", prompt)

    # The rule: no train or test term has the digit; every ood prompt has a term with it.
    assert not any(FORBIDDEN_DIGIT in t for p in train | test for t in terms(p))
    assert all(any(FORBIDDEN_DIGIT in t for t in terms(p)) for p in ood)
    # Same sizes otherwise: term counts and digits per term.
    for prompts in (train, ood):
        counts = Counter(len(terms(p)) for p in prompts)
        assert set(counts) == set(range(TASK.min_terms, TASK.max_terms + 1))
        assert max(len(t) for p in prompts for t in terms(p)) == TASK.max_digits
    # The running total never goes below zero, and the answer is the chain's value.
    for ex in examples(TASK, "ood", 1, 300) + examples(TASK, "train", 1, 300):
        total = ex.meta["first"]
        for sign, term in ex.meta["ops"]:
            total += term if sign == "+" else -term
            assert total >= 0
        assert total == ex.answer


def test_the_demonstrator_is_deterministic_per_seed():
    exs = examples(TASK, "train", 0, 200)
    first = [TASK.demonstration(ex, random.Random(f"demo:{i}")) for i, ex in enumerate(exs)]
    again = [TASK.demonstration(ex, random.Random(f"demo:{i}")) for i, ex in enumerate(exs)]
    other = [TASK.demonstration(ex, random.Random(f"other:{i}")) for i, ex in enumerate(exs)]
    assert first == again and first != other


def test_the_demonstrator_produces_the_stated_share_of_imperfect_traces():
    """docs/reasoning.md states: strategies in their configured shares; ~22% of the
    demonstrations end in a wrong answer (half of the guesses, and uncaught slips)."""
    rng = random.Random(0)
    exs = examples(TASK, "train", 0, 4000, unique=False)
    texts = [TASK.demonstration(ex, rng) for ex in exs]
    counters = [count_behaviour(t) for t in texts]
    n = len(texts)
    shares = dict(STRATEGIES)
    guessed = sum(c.guessed for c in counters) / n
    checked = sum(c.checks > 0 for c in counters) / n
    combined = sum(c.combined > 0 for c in counters) / n
    assert abs(guessed - shares["guess"]) < 0.03
    assert abs(checked - shares["careful"]) < 0.03
    # a 2-term chain has one operation: "combine" writes it as a plain step
    assert shares["combine"] * 0.7 < combined < shares["combine"] + 0.03
    wrong = sum(TASK.verify(t, ex) == 0.0 for t, ex in zip(texts, exs, strict=True)) / n
    assert 0.17 < wrong < 0.27
    # every trace is in the grammar, slips are counted, careful traces catch theirs
    assert all(c.other_lines == 0 and c.answered for c in counters)
    careful = [c for c in counters if c.checks]
    assert sum(c.backtracks for c in careful) == sum(c.wrong_steps for c in careful) > 0
    assert all(TASK.verify(t, ex) == 1.0 for t, ex, c in zip(texts, exs, counters, strict=True) if c.checks)
    lengths = [len(t) for t in texts]
    assert min(lengths) < 15 and max(lengths) > 150


def test_behaviour_counters_on_hand_made_traces():
    careful = ("47+385=432 ?432-385=47 ok\n432-96=346 ?346+96=442 no\n"
               "432-96=336 ?336+96=432 ok\n336+710=1046 ?1046-710=336 ok\n<a>1046</a>")
    c = count_behaviour(careful)
    assert (c.steps, c.combined, c.checks, c.backtracks, c.wrong_steps, c.other_lines) == \
        (4, 0, 4, 1, 1, 0)
    assert c.answered and not c.guessed
    assert (c.missed_slips, c.false_alarms) == (0, 0)  # the slip's check said "no"
    ritual = count_behaviour("5+5=11 ?11-5=5 ok\n11+1=12 ?12-1=10 no\n<a>12</a>")
    assert (ritual.missed_slips, ritual.false_alarms, ritual.wrong_steps) == (1, 1, 1)
    m = c.as_metrics()
    assert m["checked_step_share"] == 1.0 and m["guess"] == 0.0 and m["no_answer"] == 0.0

    sloppy = "47+385-96=336\n336+710=1056\nhmm\n<a>1056</a>"
    c = count_behaviour(sloppy)
    assert (c.steps, c.combined, c.checks, c.backtracks, c.wrong_steps, c.other_lines) == \
        (1, 1, 0, 0, 1, 1)
    assert count_behaviour("<a>1046</a>").guessed
    nothing = count_behaviour("47+385=432")
    assert not nothing.answered and nothing.as_metrics()["no_answer"] == 1.0


def test_trace_stats_for_reports():
    texts = ["<a>1046</a>", "47+385-96=336\n336+710=1046\n<a>1046</a>"]
    means = behaviour_means(TASK, texts, [EX, EX])
    assert means["behaviour/guess"] == 0.5 and means["behaviour/combined_steps"] == 0.5
    assert behaviour_means(make_task("arithmetic"), ["1"], [EX]) == {}
    assert length_by_outcome([10, 20, 40], [True, False, False]) == {
        "length/right_mean": 10.0, "length/wrong_mean": 30.0}
    assert length_by_outcome([5], [True]) == {"length/right_mean": 5.0}
    easy = chain("1+2=")
    rows = by_difficulty(TASK, [easy, EX, EX], [4, 30, 50], [True, True, False])
    assert rows["difficulty/2/accuracy"] == 1.0 and rows["difficulty/4/accuracy"] == 0.5
    assert rows["difficulty/4/mean_length"] == 40.0 and rows["difficulty/4/share"] == 2 / 3


@pytest.mark.parametrize("options", [
    {"min_terms": 1}, {"max_terms": 1}, {"max_digits": 0}, {"step_error": 1.5},
    {"strategies": {"hope": 1.0}}, {"strategies": {"guess": 0.0}}, {"test_share": 1.0},
])
def test_bad_options_are_one_line_errors(options):
    with pytest.raises(TaskOptionError) as err:
        make_task("long_arithmetic", **options)
    assert "\n" not in str(err.value)


def test_parse_answer():
    assert parse_answer(" <a>12</a> \n") == 12
    assert parse_answer("<a>12</a><a>12</a>") is None
