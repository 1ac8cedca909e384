"""Unbiased pass@k against hand-computed values, and the evaluation driver on the tiny model."""

import itertools
import math
from fractions import Fraction

import pytest

from rlscale.rlvr.evaluate import evaluate, pass_at_k
from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.tasks import make_task


@pytest.mark.parametrize("n, c, k, expected", [
    # 1 - C(3,1)/C(5,1) = 1 - 3/5
    (5, 2, 1, 0.4),
    # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 2, 0.7),
    # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (5, 2, 3, 0.9),
    # n - c < k: every k-subset holds a correct sample
    (5, 2, 4, 1.0),
    (5, 5, 1, 1.0),
    (1, 1, 1, 1.0),
    # no correct sample: 0 whatever k
    (5, 0, 1, 0.0),
    (5, 0, 5, 0.0),
    (1, 0, 1, 0.0),
    # 1 - C(6,4)/C(10,4) = 1 - 15/210 = 13/14
    (10, 4, 4, 13 / 14),
    # k = n: 1 as soon as one is correct
    (10, 1, 10, 1.0),
    # 1 - C(99,1)/C(100,1)
    (100, 1, 1, 0.01),
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_the_success_rate():
    for n in range(1, 12):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


def test_pass_at_k_matches_binomials_and_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                # the definition: share of k-subsets of n samples that contain a correct one
                samples = [True] * c + [False] * (n - c)
                subsets = list(itertools.combinations(samples, k))
                assert exact == Fraction(sum(any(s) for s in subsets), len(subsets))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    value = pass_at_k(1000, 10, 100)
    assert value == pytest.approx(float(1 - Fraction(math.comb(990, 100), math.comb(1000, 100))),
                                  abs=1e-12)
    assert 0.0 < value < 1.0
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4, abs=1e-15)


def test_pass_at_k_monotone():
    n = 16
    for c in range(n + 1):
        values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(values))
    for k in range(1, n + 1):
        values = [pass_at_k(n, c, k) for c in range(n + 1)]
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(values))


@pytest.mark.parametrize("n, c, k", [
    (5, 6, 1),    # more correct than samples
    (5, -1, 1),   # negative count
    (5, 2, 0),    # k must be >= 1
    (5, 2, 6),    # k larger than n
    (0, 0, 1),
    (5, 2, -1),
])
def test_pass_at_k_validates_input(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("tiny", seed=0)


def test_evaluate_counts_and_pass_at_k(tiny):
    model, tokenizer = tiny
    task = make_task("arithmetic")
    result = evaluate(model, tokenizer, task, prompts=12, samples=3, ks=(1, 2, 3),
                      max_new_tokens=4, seed=0, batch_size=10)
    assert result.n == 12 and result.samples == 3
    assert len(result.per_prompt_correct) == 12
    assert all(0 <= c <= 3 for c in result.per_prompt_correct)
    for k in (1, 2, 3):
        expected = sum(pass_at_k(3, c, k) for c in result.per_prompt_correct) / 12
        assert result.pass_at[k] == pytest.approx(expected)
    assert 1 <= result.mean_length <= 4
    row = result.as_dict()
    assert {"pass@1", "pass@2", "pass@3", "n", "samples", "mean_length"} <= set(row)


def test_evaluate_scores_a_model_that_always_answers_right(tiny, monkeypatch):
    """Decoded completions replaced by one right and one wrong answer per prompt."""
    import rlscale.rlvr.evaluate as ev

    model, tokenizer = tiny
    task = make_task("arithmetic")
    answers = {}

    def oracle(tokenizer_, rollout):
        texts = []
        for ids in rollout.prompt_ids:
            prompt = tokenizer.decode(ids)
            answers[prompt] = answers.get(prompt, 0) + 1
            # one of the two samples per prompt is right
            good = answers[prompt] % 2 == 1
            texts.append(prompt_answer(prompt) if good else "x")
        return texts

    def prompt_answer(prompt):
        a, op, b = (prompt[:-1].partition("+") if "+" in prompt else prompt[:-1].partition("*"))
        return str(int(a) + int(b) if op == "+" else int(a) * int(b))

    monkeypatch.setattr(ev, "decode_completions", oracle)
    result = evaluate(model, tokenizer, task, prompts=10, samples=2, ks=(1, 2),
                      max_new_tokens=2, batch_size=7)
    assert result.per_prompt_correct == [1] * 10
    assert result.pass_at == {1: pytest.approx(0.5), 2: pytest.approx(1.0)}


def test_evaluate_needs_enough_samples(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="pass@8"):
        evaluate(model, tokenizer, make_task("arithmetic"), prompts=2, samples=4, ks=(1, 8))
