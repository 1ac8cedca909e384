"""Task sources beyond the built-in tasks: reasoning-gym, JSONL / Parquet / `datasets`
folders with math-verify, user verifiers by dotted path, chat prompts; and bad inputs, each a
one-line error naming the problem."""

import json
import pickle
import random
from pathlib import Path

import pytest

from rlscale.rlvr.tasks import ChatMessage, Example, TaskOptionError, examples, make_task
from rlscale.rlvr.tasks.answers import exact_match, math_verify_match
from rlscale.rlvr.tasks.files import DatasetError
from rlscale.runtime.dotted import DottedPathError

REPO = Path(__file__).resolve().parents[1]


RG_OPTIONS = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=["+", "-"],
                  allow_parentheses=False, allow_negation=False, size=1000, seed=3)


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# -- reasoning-gym -------------------------------------------------------------------------

def test_reasoning_gym_scores_its_own_answers_in_tags():
    task = make_task("reasoning_gym:basic_arithmetic", **RG_OPTIONS)
    items = examples(task, "train", seed=0, n=20)
    assert all(ex.prompt.startswith("Calculate ") for ex in items)
    rng = random.Random(0)
    for ex in items:
        right = task.demonstration(ex, rng)
        assert right == f"<answer>{ex.answer}</answer>"
        assert task.verify(right, ex) == 1.0
        assert task.verify(f"I think <answer> {ex.answer} </answer>", ex) == 1.0
        assert task.verify(str(ex.answer), ex) == 0.0  # no tags: no answer
        assert task.verify(f"<answer>{int(ex.answer) + 1}</answer>", ex) == 0.0
    # The held-out split is disjoint from training, as for every task.
    test = {ex.prompt for ex in examples(task, "test", seed=0, n=20)}
    assert not test & {ex.prompt for ex in examples(task, "train", seed=1, n=200)}


def test_reasoning_gym_untagged_answers_and_pickling():
    task = make_task("reasoning_gym:chain_sum", answer_tag=None, size=50, seed=1)
    ex = examples(task, "train", seed=0, n=1)[0]
    assert task.demonstration(ex, random.Random(0)) == str(ex.answer)
    assert task.verify(f"  {ex.answer}\n", ex) == 1.0
    copy = pickle.loads(pickle.dumps(task))  # as a verifier worker receives it
    assert copy._dataset is None  # the recipe travels, not the dataset
    assert copy.verify(str(ex.answer), ex) == 1.0


def test_reasoning_gym_bad_inputs():
    with pytest.raises(TaskOptionError) as exc:
        make_task("reasoning_gym:basic_arithmetc")
    assert "unknown reasoning-gym dataset 'basic_arithmetc'" in one_line(exc)
    assert "basic_arithmetic" in str(exc.value)  # the close match is suggested
    with pytest.raises(TaskOptionError) as exc:
        make_task("reasoning_gym:basic_arithmetic", no_such_knob=3)
    assert "bad options for reasoning-gym dataset" in one_line(exc)
    with pytest.raises(TaskOptionError) as exc:
        make_task("reasoning_gym:basic_arithmetic", answer_tag="not a tag")
    assert "answer_tag" in one_line(exc)


# -- answer checkers -----------------------------------------------------------------------

@pytest.mark.parametrize("completion, reference, expected", [
    ("0.5", r"\frac{1}{2}", 1.0),
    (r"$\frac{1}{2}$", "0.5", 1.0),
    (r"\boxed{\frac{7}{2}}", "$3.5$", 1.0),
    ("3.5", r"$\frac{7}{2}$", 1.0),
    ("7/2", r"\frac72", 1.0),
    (r"$\frac{10}{8}$", r"$\frac{5}{4}$", 1.0),
    ("3.6", r"$\frac{7}{2}$", 0.0),
    ("", "$4$", 0.0),
    ("banana", "$4$", 0.0),
])
def test_math_verify_compares_values_not_strings(completion, reference, expected):
    assert math_verify_match(completion, reference) == expected


def test_exact_match_is_strict_but_strips():
    assert exact_match(" 42\n", "42") == 1.0
    assert exact_match("42.0", "42") == 0.0


# -- dataset files -------------------------------------------------------------------------

ROWS = [
    {"prompt": "Halve 7.", "answer": r"$\frac{7}{2}$", "split": "train"},
    {"prompt": "Compute 2 + 2.", "answer": "$4$", "split": "train"},
    {"prompt": "Add 1/4 + 1/4.", "answer": r"$\frac{1}{2}$", "split": "test"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_with_math_verify_and_a_split_field(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    task = make_task(f"jsonl:{path}", split_field="split")
    train, test = task.split_examples("train"), task.split_examples("test")
    assert [ex.prompt for ex in train] == ["Halve 7.", "Compute 2 + 2."]
    assert [ex.prompt for ex in test] == ["Add 1/4 + 1/4."]
    assert task.verify("3.5", train[0]) == 1.0          # decimal vs LaTeX reference
    assert task.verify(r"\frac{14}{4}", train[0]) == 1.0
    assert task.verify("4", train[0]) == 0.0
    assert task.verify("0.5", test[0]) == 1.0
    assert task.demonstration(train[0], random.Random(0)) == r"$\frac{7}{2}$"
    assert train[0].meta["row"]["split"] == "train"
    # Evaluation takes every test row once, however many prompts are asked for.
    assert [ex.prompt for ex in examples(task, "test", seed=0, n=500)] == ["Add 1/4 + 1/4."]


def test_hash_split_is_deterministic_and_disjoint(tmp_path):
    rows = [{"prompt": f"Compute {a} + 1.", "answer": f"{a + 1}"} for a in range(300)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    task = make_task(f"jsonl:{path}", test_share=0.2, verifier="exact")
    train = {ex.prompt for ex in task.split_examples("train")}
    test = {ex.prompt for ex in task.split_examples("test")}
    assert not train & test and len(train | test) == 300
    assert 30 <= len(test) <= 90
    again = make_task(f"jsonl:{path}", test_share=0.2, verifier="exact")
    assert {ex.prompt for ex in again.split_examples("test")} == test
    ex = task.split_examples("train")[0]
    assert task.verify(str(ex.answer), ex) == 1.0 and task.verify(f"{ex.answer}.0", ex) == 0.0


def test_parquet_and_datasets_folders(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"question": r["prompt"], "solution": r["answer"]} for r in ROWS]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    task = make_task(f"parquet:{tmp_path / 'p.parquet'}", prompt_field="question",
                     answer_field="solution", test_share=0.0)
    assert len(task.split_examples("train")) == 3
    ex = task.split_examples("train")[0]
    assert task.verify("3.5", ex) == 1.0

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:2]),
                               "test": datasets.Dataset.from_list(ROWS[2:])})
    dd.save_to_disk(str(tmp_path / "dd"))
    task = make_task(f"hf:{tmp_path / 'dd'}")
    assert [ex.prompt for ex in task.split_examples("test")] == ["Add 1/4 + 1/4."]
    assert len(task.split_examples("train")) == 2

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "flat"))
    task = make_task(f"hf:{tmp_path / 'flat'}", split_field="split")
    assert len(task.split_examples("train")) == 2 and len(task.split_examples("test")) == 1


def test_user_verifier_by_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "my_checks.py").write_text(
        "def within_one(completion, example):\n"
        "    return float(abs(float(completion) - float(example.meta['row']['value'])) <= 1)\n")
    monkeypatch.chdir(tmp_path)  # the current directory is on the import path
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x", "answer": "10", "value": 10}])
    task = make_task(f"jsonl:{path}", verifier="my_checks:within_one", test_share=0.0)
    ex = task.split_examples("train")[0]
    assert task.verify("10.5", ex) == 1.0 and task.verify("12", ex) == 0.0
    assert pickle.loads(pickle.dumps(task)).verify("9", ex) == 1.0


def test_chat_messages_field(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Halve 7."},
                          {"role": "assistant", "content": "$3.5$"}], "answer": "3.5"}]
    task = make_task(f"jsonl:{write_jsonl(tmp_path / 'c.jsonl', rows)}", test_share=0.0)
    ex = task.split_examples("train")[0]
    assert ex.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "Halve 7."))
    assert task.demonstration(ex, random.Random(0)) == "$3.5$"  # the assistant reply
    assert task.verify(r"$\frac{7}{2}$", ex) == 1.0


@pytest.mark.parametrize("name, options, message", [
    ("jsonl:{tmp}/missing.jsonl", {}, "jsonl data not found"),
    ("parquet:{tmp}/missing.parquet", {}, "parquet data not found"),
    ("hf:{tmp}/p.jsonl", {}, "cannot load a datasets folder"),
    ("jsonl:{tmp}/p.jsonl", {"answer_field": "solution"}, "no answer field 'solution'"),
    ("jsonl:{tmp}/p.jsonl", {"prompt_field": "q", "messages_field": "m"}, "no prompt field 'q'"),
    ("jsonl:{tmp}/p.jsonl", {"split_field": "kind"}, "split field 'kind' must be train or test"),
    ("jsonl:{tmp}/p.jsonl", {"verifier": "no_such_module:fn"}, "cannot import module 'no_such_module'"),
    ("jsonl:{tmp}/p.jsonl", {"verifier": "json:no_such_fn"}, "has no attribute 'no_such_fn'"),
    ("jsonl:{tmp}/p.jsonl", {"verifier": "nonsense"}, "must be 'package.module:name'"),
    ("jsonl:{tmp}/bad.jsonl", {}, "line 2: not JSON"),
    ("jsonl:{tmp}/chat.jsonl", {}, "must end with a user message"),
    ("reasoning_gym:no_such_dataset", {}, "unknown reasoning-gym dataset"),
])
def test_bad_inputs_are_one_line_errors(tmp_path, name, options, message):
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "answer": "1", "kind": "add"}])
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": "1"}\n{oops\n')
    write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "system", "content": "s"}],
                                           "answer": "1"}])
    with pytest.raises((DatasetError, DottedPathError, TaskOptionError)) as exc:
        make_task(name.format(tmp=tmp_path), **options)
    assert message in one_line(exc)


def test_unknown_task_names_the_sources():
    with pytest.raises(ValueError) as exc:
        make_task("gsm8k")
    assert "reasoning_gym:..." in one_line(exc) and "jsonl:..." in str(exc.value)


def test_the_shipped_example_file_loads_and_scores():
    task = make_task(f"jsonl:{REPO / 'examples/math_latex/problems.jsonl'}")
    train, test = task.split_examples("train"), task.split_examples("test")
    assert len(train) + len(test) == 2000 and 100 <= len(test) <= 300
    rng = random.Random(0)
    assert all(task.verify(task.demonstration(ex, rng), ex) == 1.0 for ex in test)
    halves = [ex for ex in train if ex.prompt.startswith("Halve ") and "frac" in ex.answer]
    n = int(halves[0].prompt.split()[1].rstrip("."))
    assert task.verify(str(n / 2), halves[0]) == 1.0  # a decimal for a LaTeX fraction


def test_example_is_still_hashable_with_messages():
    ex = Example("p", 1, messages=(ChatMessage("user", "p"),))
    assert hash(ex) == hash(Example("p", 1, messages=(ChatMessage("user", "p"),)))


def test_corrupted_demonstrations_are_never_accepted():
    """`rlscale sft data.wrong_share` for reasoning-gym and data files: a digit changed or
    the answer tags broken; the verifier rejects every one of them."""
    rng = random.Random(0)
    task = make_task("reasoning_gym:basic_arithmetic", **RG_OPTIONS)
    wrong = [task.corrupt(ex, rng) for ex in examples(task, "train", seed=0, n=100)]
    assert all(task.verify(w, ex) < 1.0 for w, ex in
               zip(wrong, examples(task, "train", seed=0, n=100), strict=True))
    assert any(w.startswith("<answer>") and w.endswith("</answer>") for w in wrong)  # wrong digit
    assert any(not w.endswith("</answer>") for w in wrong)  # broken tags
    data = make_task(f"jsonl:{REPO / 'examples/math_latex/problems.jsonl'}")
    for ex in data.split_examples("test"):
        assert data.verify(data.corrupt(ex, rng), ex) == 0.0
