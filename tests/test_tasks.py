"""Built-in tasks: disjoint splits, deterministic draws, strict and safe verifiers."""

import builtins
import os
import random
import subprocess
import time
from fractions import Fraction

import pytest

from rlscale.rlvr.tasks import (
    ArithmeticTask,
    CountdownTask,
    Example,
    UnknownTaskError,
    examples,
    make_task,
    split_of,
)
from rlscale.rlvr.tasks.countdown import ExpressionError, evaluate_expression, solve

TASK_NAMES = ["arithmetic", "countdown"]


def draw(task, split, n, seed=0):
    rng = random.Random(seed)
    return [task.sample(split, rng) for _ in range(n)]


@pytest.mark.parametrize("name", TASK_NAMES)
def test_train_and_test_never_share_a_prompt(name):
    task = make_task(name)
    train = {ex.prompt for seed in range(2) for ex in draw(task, "train", 2000, seed)}
    test = {ex.prompt for seed in range(2) for ex in draw(task, "test", 2000, seed)}
    assert len(train) > 500 and len(test) > 200
    assert not train & test
    assert all(split_of(p, task.test_share) == "train" for p in train)
    assert all(split_of(p, task.test_share) == "test" for p in test)


def test_split_of_is_a_fixed_function_of_the_prompt():
    prompts = [f"{a}+{b}=" for a in range(60) for b in range(60)]
    first = [split_of(p) for p in prompts]
    assert first == [split_of(p) for p in prompts]
    share = first.count("test") / len(first)
    assert 0.07 < share < 0.13  # test_share 0.1
    assert {split_of(p, 0.0) for p in prompts} == {"train"}
    assert {split_of(p, 1.0) for p in prompts} == {"test"}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_sample_rejects_unknown_split(name):
    with pytest.raises(ValueError, match="valid"):
        make_task(name).sample("valid", random.Random(0))


@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("split", ["train", "test"])
def test_examples_deterministic_per_seed_and_distinct(name, split):
    task = make_task(name)
    first = examples(task, split, 3, 300)
    assert first == examples(make_task(name), split, 3, 300)
    assert [e.meta for e in first] == [e.meta for e in examples(task, split, 3, 300)]
    assert len({e.prompt for e in first}) == 300
    other = examples(task, split, 4, 300)
    assert [e.prompt for e in other] != [e.prompt for e in first]
    # the seed, not global random state, decides the draw
    random.seed(123)
    assert examples(task, split, 3, 50) == first[:50]


def test_examples_too_many_distinct_prompts_is_a_clear_error():
    tiny = ArithmeticTask(add_digits=1, mul_share=0.0)  # at most 100 distinct prompts
    with pytest.raises(ValueError, match="fewer than 500 distinct"):
        examples(tiny, "train", 0, 500)
    assert len(examples(tiny, "train", 0, 500, unique=False)) == 500


def test_arithmetic_prompt_and_answer():
    for ex in examples(ArithmeticTask(), "train", 0, 500):
        left, right = ex.prompt[:-1].split(ex.meta["op"])
        assert ex.prompt.endswith("=")
        expected = int(left) + int(right) if ex.meta["op"] == "+" else int(left) * int(right)
        assert ex.answer == expected


@pytest.mark.parametrize("name", TASK_NAMES)
def test_verifier_accepts_demonstrations_and_rejects_corruptions(name):
    task = make_task(name)
    rng = random.Random(0)
    for ex in examples(task, "train", 0, 300) + examples(task, "test", 0, 100):
        good = task.demonstration(ex, rng)
        assert task.verify(good, ex) == 1.0, (ex.prompt, good)
        bad = task.corrupt(ex, rng)
        assert bad != good
        assert task.verify(bad, ex) == 0.0, (ex.prompt, bad)


def test_arithmetic_verifier_format():
    task = ArithmeticTask()
    ex = Example("347+85=", 432, {"op": "+"})
    assert task.verify("432", ex) == 1.0
    assert task.verify("432\n", ex) == 1.0  # trailing newline before EOS is harmless
    for sloppy in ["432 ok", "=432", "432.", "432.0", "4 32", "+432", "0x1b0", "432432",
                   "433", "", " ", "four hundred thirty-two", "347+85=432", "432=",
                   "4_32", "\u0664\u0663\u0662", "\uff14\uff13\uff12"]:
        assert task.verify(sloppy, ex) == 0.0, repr(sloppy)
    zero = Example("0+0=", 0, {"op": "+"})
    assert task.verify("0", zero) == 1.0
    assert task.verify("-0", zero) == 1.0  # parses as the integer 0
    assert task.verify("1", zero) == 0.0


# --------------------------------------------------------------------------- countdown


def countdown(numbers, target):
    shown = sorted(numbers)
    return Example(f"{' '.join(map(str, shown))}->{target}:", target, {"numbers": shown})


def test_countdown_puzzles_are_solvable_and_well_formed():
    task = CountdownTask()
    for ex in examples(task, "train", 0, 300):
        numbers = ex.meta["numbers"]
        assert len(numbers) == 3 and numbers == sorted(numbers)
        assert all(1 <= n <= 20 for n in numbers)
        assert 0 < ex.answer <= 100
        assert ex.prompt == f"{' '.join(map(str, numbers))}->{ex.answer}:"
        assert solve(numbers, ex.answer) is not None


def test_countdown_verifier_basic():
    task = CountdownTask()
    ex = countdown([3, 4, 5], 35)
    assert task.verify("(3+4)*5", ex) == 1.0
    assert task.verify(" ( 3 + 4 ) * 5 ", ex) == 1.0
    assert task.verify("5*(4+3)", ex) == 1.0
    assert task.verify("3+4*5", ex) == 0.0  # 23: precedence is respected
    assert task.verify("7*5", ex) == 0.0    # 7 is not given
    for sloppy in ["(3+4)*5=35", "answer: (3+4)*5", "(3+4)*5.", "(3+4*5", "35 = (3+4)*5",
                   "(3+4)x5", "", "(3.0+4)*5", "-(3+4)*-5", "(3+4)*5;", "(3+4)*5 # done", "(3+4)*5\n(3+4)*5"]:
        assert task.verify(sloppy, ex) == 0.0, repr(sloppy)


def test_countdown_numbers_used_at_most_as_often_as_given():
    task = CountdownTask()
    ex = countdown([2, 3, 6], 12)
    assert task.verify("2*6", ex) == 1.0       # not every number has to be used
    assert task.verify("2*3*2", ex) == 0.0     # 2 given once, used twice
    assert task.verify("6+6", ex) == 0.0
    twice = countdown([2, 2, 3], 12)
    assert task.verify("2*2*3", twice) == 1.0  # 2 given twice
    assert task.verify("2*2*3*1", twice) == 0.0
    assert task.verify("(2+2+2)*2", twice) == 0.0


def test_countdown_division_is_exact():
    task = CountdownTask()
    # 1/49*49 is 0.9999999999999999 in floating point, exactly 1 as a fraction
    assert 1 / 49 * 49 != 1
    assert task.verify("1/49*49", countdown([1, 49, 49], 1)) == 1.0
    # 7/2 is 3.5, not 3: no integer or floor division
    assert task.verify("7/2", countdown([7, 2, 1], 3)) == 0.0
    assert task.verify("7//2", countdown([7, 2, 1], 3)) == 0.0
    assert task.verify("7/2*2", countdown([7, 2, 2], 7)) == 1.0
    assert task.verify("(7-7)/1", countdown([7, 7, 1], 1)) == 0.0
    assert task.verify("5/(3-3)", countdown([5, 3, 3], 1)) == 0.0  # division by zero
    assert evaluate_expression("20/6") == (Fraction(10, 3), [20, 6])
    assert evaluate_expression("(1+2)*3-4/8") == (Fraction(17, 2), [1, 2, 3, 4, 8])


DANGEROUS = [
    "__import__('os').system('x')",
    "__import__('os').system('touch PWNED')",
    "open('PWNED', 'w').write('x')",
    "x", "x+1", "a*b",
    "abs(3)", "int('1024')", "print(1)",
    "2**10", "2**10**10",
    "(3).real", "(1024).__class__", "[].__class__.__base__",
    "1 if 1 else 2", "[1024][0]", "{1024: 1}[1024]", "(lambda: 1024)()",
    "1024 == 1024", "True+1023", "'1024'", "f'{1024}'",
    "'a'*999999999", "1024 and 1", "-1024", "~1023", "1024;", "1024 # comment", "0x400", "1_024", "1024\\\n",
    "9" * 10_000, "1+" * 5_000 + "1", "(" * 150 + "1" + ")" * 150,
    "1" * 100 + "\n" + "1" * 100,
]


@pytest.mark.parametrize("text", DANGEROUS)
def test_countdown_verifier_runs_nothing(text, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    task = CountdownTask()
    ex = countdown([2, 10, 1024], 1024)
    calls = []
    real_import = builtins.__import__

    def recording(name):
        def record(*args, **kwargs):
            calls.append((name, args[:1]))
            if name == "__import__":
                return real_import(*args, **kwargs)
            raise RuntimeError(f"the verifier must not call {name}")
        return record

    # Patched only around the call: pytest itself imports lazily while reporting.
    patches = {(builtins, "eval"), (builtins, "exec"), (builtins, "__import__"),
               (builtins, "open"), (os, "system"), (subprocess, "run"), (subprocess, "Popen")}
    saved = {(obj, attr): getattr(obj, attr) for obj, attr in patches}
    for obj, attr in patches:
        setattr(obj, attr, recording(attr))
    start = time.perf_counter()
    try:
        score = task.verify(text, ex)
    finally:
        elapsed = time.perf_counter() - start
        for (obj, attr), value in saved.items():
            setattr(obj, attr, value)
    assert score == 0.0
    assert calls == []
    assert elapsed < 0.5
    assert not (tmp_path / "PWNED").exists()
    assert task.verify("1024", ex) == 1.0  # the example itself is solvable


def test_countdown_verifier_works_without_eval(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("eval used")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    task = CountdownTask()
    rng = random.Random(0)
    for ex in examples(task, "test", 1, 50):
        assert task.verify(task.demonstration(ex, rng), ex) == 1.0


def test_evaluate_expression_rejects_with_expression_error():
    for text in ["2**10", "abs(1)", "x", "1.5", "'a'", "1 +", "9" * 201]:
        with pytest.raises(ExpressionError):
            evaluate_expression(text)


# --------------------------------------------------------------------------- registry


def test_make_task_unknown_names_known_tasks():
    with pytest.raises(UnknownTaskError) as exc_info:
        make_task("nope")
    message = str(exc_info.value)
    assert "nope" in message and "arithmetic" in message and "countdown" in message
    assert "\n" not in message


def test_make_task_bad_option_is_unknown_task_error():
    with pytest.raises(UnknownTaskError, match="arithmetic"):
        make_task("arithmetic", digits=5)


def test_make_task_passes_options():
    task = make_task("countdown", count=4, max_number=9)
    assert isinstance(task, CountdownTask) and task.count == 4
    for ex in examples(task, "train", 0, 50):
        assert len(ex.meta["numbers"]) == 4 and max(ex.meta["numbers"]) <= 9
