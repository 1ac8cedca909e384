"""The `ood` split: arithmetic with one digit more than training, countdown with one number
more; disjoint from train and test by construction, scored by the same verifier, and
evaluated end to end with `rlscale rlvr eval --split ood`. Tasks without one say so in a line."""

import json
import random
import re

import pytest
from typer.testing import CliRunner

from rlscale.cli import app
from rlscale.rlvr.tasks import TaskOptionError, examples, make_task
from rlscale.rlvr.tasks.base import draw_in_split

N = 2000


def prompts(task, split, n=N, seed=0):
    """The prompts of n draws (repeats allowed: a small task has few distinct test prompts)."""
    return {ex.prompt for ex in examples(task, split, seed, n, unique=False)}


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def digits(prompt: str) -> tuple[str, int, int]:
    a, op, b = re.fullmatch(r"([0-9]+)([+*])([0-9]+)=", prompt).groups()
    return op, len(a), len(b)


@pytest.mark.parametrize("options", [{}, {"add_digits": 2, "mul_digits": (1, 2)}])
def test_arithmetic_ood_is_one_digit_longer_and_disjoint(options):
    task = make_task("arithmetic", **options)
    train, test = prompts(task, "train"), prompts(task, "test")
    ood = {ex.prompt for ex in examples(task, "ood", 0, N)}
    assert len(ood) == N  # distinct prompts
    assert not ood & train and not ood & test
    add, (mul_a, mul_b) = task.add_digits, task.mul_digits
    for prompt in train | test:
        op, da, db = digits(prompt)
        assert (max(da, db) <= add) if op == "+" else (da <= mul_a and db <= mul_b)
    ops = set()
    for prompt in ood:
        op, da, db = digits(prompt)
        ops.add(op)
        if op == "+":
            assert max(da, db) == add + 1, prompt
        else:
            assert da == mul_a + 1 and db <= mul_b, prompt
    assert ops == {"+", "*"}


@pytest.mark.parametrize("count", [3, 4])
def test_countdown_ood_has_one_number_more_and_is_disjoint(count):
    task = make_task("countdown", count=count)
    train, test = prompts(task, "train"), prompts(task, "test")
    ood = examples(task, "ood", 0, N)
    assert len({ex.prompt for ex in ood}) == N
    assert not {ex.prompt for ex in ood} & (train | test)
    assert all(len(p.split("->")[0].split()) == count for p in train | test)
    for ex in ood:
        assert len(ex.meta["numbers"]) == count + 1
        assert all(1 <= n <= task.max_number for n in ex.meta["numbers"])
        assert 1 <= ex.answer <= task.max_target


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_ood_demonstrations_verify_and_wrong_answers_do_not(name):
    task = make_task(name)
    rng = random.Random(0)
    for ex in examples(task, "ood", 1, 30):
        assert task.verify(task.demonstration(ex, rng), ex) == 1.0
        assert task.verify(task.corrupt(ex, rng), ex) == 0.0


def test_ood_sampling_is_deterministic_and_leaves_train_unchanged():
    task = make_task("arithmetic")
    assert [task.sample("ood", random.Random(5)).prompt for _ in range(2)] == \
        [task.sample("ood", random.Random(5)).prompt] * 2
    # the train stream is what it was before the ood split existed: the same generator
    rng_a, rng_b = random.Random(7), random.Random(7)
    assert task.sample("train", rng_a) == draw_in_split(task._generate, "train", rng_b, 0.1)


def test_unknown_split_is_one_line():
    for name in ("arithmetic", "countdown"):
        with pytest.raises(TaskOptionError) as exc:
            make_task(name).sample("validation", random.Random(0))
        text = one_line(exc)
        assert "validation" in text and name in text and "ood" in text


def test_a_data_file_has_no_ood_split(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                            for i in range(20)))
    task = make_task(f"jsonl:{path}", verifier="exact")
    for call in (lambda: task.sample("ood", random.Random(0)),
                 lambda: examples(task, "ood", 0, 5)):
        with pytest.raises(TaskOptionError) as exc:
            call()
        text = one_line(exc)
        assert f"jsonl:{path}" in text and "no 'ood' split" in text


def test_reasoning_gym_has_no_ood_split():
    pytest.importorskip("reasoning_gym")
    task = make_task("reasoning_gym:chain_sum", size=50, seed=1)
    with pytest.raises(TaskOptionError) as exc:
        examples(task, "ood", 0, 5)
    assert "reasoning_gym:chain_sum" in one_line(exc) and "no 'ood' split" in one_line(exc)


# -- the command ---------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def assert_one_line_error(result, *words):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
def test_eval_split_ood_end_to_end(tiny_model_dir, task):
    result = CliRunner().invoke(app, ["rlvr", "eval", "--model", str(tiny_model_dir), "--task",
                                      task, "--split", "ood", "--prompts", "6", "--samples", "2",
                                      "--k", "1,2", "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["n"] == 6 and row["samples"] == 2
    assert 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0


def test_eval_bad_split_is_one_line(tiny_model_dir, tmp_path):
    runner = CliRunner()
    base = ["rlvr", "eval", "--model", str(tiny_model_dir), "--prompts", "2"]
    assert_one_line_error(runner.invoke(app, [*base, "--task", "arithmetic", "--split", "dev"]),
                          "--split", "dev", "ood")
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    assert_one_line_error(runner.invoke(app, [*base, "--task", f"jsonl:{path}", "--split", "ood"]),
                          "no 'ood' split")
