"""The tiny preset as a real Hugging Face folder: save, load back offline, round-trip text."""

import random
import string

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlscale.rlvr.model import (
    CHARACTERS,
    ModelLoadError,
    PromptFormatter,
    build_tiny_model,
    load_model,
    save_model,
)
from rlscale.rlvr.tasks import Example, examples, make_task


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    model, tokenizer = build_tiny_model("tiny", seed=0)
    return save_model(model, tokenizer, tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    try:
        import huggingface_hub.constants as hub_constants
    except ImportError:  # pragma: no cover
        return
    # The environment variable is read once at import; patch the parsed value as well.
    if hasattr(hub_constants, "HF_HUB_OFFLINE"):
        monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)


ROUND_TRIP = [
    "347+85=",
    "432",
    " leading space",
    "trailing space ",
    "  two leading, two trailing  ",
    "double  space and   triple",
    "line one\nline two\n",
    "\n\nstarts with newlines",
    "ends with newlines\n\n",
    " \n \n ",
    "3 12 17->41:",
    "(12+17)+3*4/2-1",
    "".join(CHARACTERS),
    string.printable.translate({ord(c): None for c in "\t\r\x0b\x0c"}),
]


def test_characters_cover_printable_ascii_and_newline():
    assert set(CHARACTERS) == set(string.digits + string.ascii_letters + string.punctuation + " \n")
    assert len(CHARACTERS) == len(set(CHARACTERS))


def test_saved_tiny_model_loads_with_auto_classes(tiny_dir, offline):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    original, _ = build_tiny_model("tiny", seed=0)
    loaded = model.state_dict()
    for name, tensor in original.state_dict().items():
        assert torch.equal(loaded[name], tensor), name
    assert model.config.vocab_size == len(tokenizer)
    # 0.5-1 M parameters: the preset is meant to train on a laptop CPU.
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 2_000_000


def test_auto_tokenizer_round_trips_task_texts_exactly(tiny_dir, offline):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    texts = list(ROUND_TRIP)
    rng = random.Random(0)
    for name in ("arithmetic", "countdown"):
        task = make_task(name)
        for ex in examples(task, "train", 0, 20):
            texts += [ex.prompt, task.demonstration(ex, rng), ex.prompt + task.demonstration(ex, rng)]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text), text  # character level: one token per character
        assert tokenizer.unk_token_id not in ids, text
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
        # decoding a completion that ends in EOS and is padded keeps the text intact
        padded = ids + [tokenizer.eos_token_id, tokenizer.pad_token_id]
        assert tokenizer.decode(padded, skip_special_tokens=True) == text


def test_special_token_ids_are_set_and_consistent(tiny_dir, offline):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    ids = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id,
           tokenizer.unk_token_id}
    assert None not in ids and len(ids) == 4
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "</s>"
    # EOS is a single token that never appears in encoded task text
    assert tokenizer("</s>", add_special_tokens=False)["input_ids"] == [tokenizer.eos_token_id]
    assert tokenizer.eos_token_id not in tokenizer("1+2=3", add_special_tokens=False)["input_ids"]


def test_load_model_returns_left_padding_tokenizer(tiny_dir, offline):
    model, tokenizer = load_model(tiny_dir)
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id is not None and tokenizer.eos_token_id is not None
    assert next(model.parameters()).dtype == torch.float32
    batch = tokenizer(["1+2=", "347+85="], add_special_tokens=False, padding=True)
    assert batch["input_ids"][0][:3] == [tokenizer.pad_token_id] * 3
    assert batch["attention_mask"][0] == [0, 0, 0, 1, 1, 1, 1]
    model_bf16, _ = load_model(tiny_dir, dtype="bfloat16")
    assert next(model_bf16.parameters()).dtype == torch.bfloat16


def _one_line_naming(exc_info, path):
    message = str(exc_info.value)
    assert "\n" not in message
    assert str(path) in message
    return message


def test_load_model_missing_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError) as exc_info:
        load_model(missing)
    _one_line_naming(exc_info, missing)


def test_load_model_folder_without_config(tmp_path):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "README.md").write_text("hello\n")
    with pytest.raises(ModelLoadError) as exc_info:
        load_model(folder)
    assert "config.json" in _one_line_naming(exc_info, folder)


@pytest.mark.parametrize("content", ["{not json", "{}"])
def test_load_model_broken_config_is_one_line(tmp_path, offline, content):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text(content)
    with pytest.raises(ModelLoadError) as exc_info:
        load_model(folder)
    _one_line_naming(exc_info, folder)


def test_load_model_unknown_dtype(tiny_dir):
    with pytest.raises(ModelLoadError, match="int8"):
        load_model(tiny_dir, dtype="int8")


def test_unknown_preset():
    with pytest.raises(ModelLoadError, match="huge"):
        build_tiny_model("huge")


def test_prompt_formatter(tiny_dir, offline):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert not getattr(tokenizer, "chat_template", None)
    assert PromptFormatter(tokenizer)(Example("347+85=", 432)) == "347+85="
    with pytest.raises(ModelLoadError, match="chat template"):
        PromptFormatter(tokenizer, chat_template=True)
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}")
    assert PromptFormatter(tokenizer, chat_template=True)(Example("1+2=", 3)) == "[user]1+2=\n[assistant]"
