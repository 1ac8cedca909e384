"""`reasoning_gym:<dataset>`: any of reasoning-gym's procedural datasets as a task.

reasoning-gym generates every entry locally from (seed, index), so nothing is downloaded.
`task.options` go to the dataset's constructor (its config: `size`, `seed`, difficulty
knobs such as `min_digits`), except the three this adapter reads itself:
- `answer_tag` ("answer"): the completion's answer is the text of its last
  `<answer>...</answer>`, extracted as reasoning-gym's own utilities do; null scores the
  whole completion (stripped) as the answer.
- `test_share` (0.1): the held-out share, split by a hash of the question as for every task.
- `prompt_template` ("{question}"): how a question becomes the prompt.
The verifier is the dataset's own `score_answer(answer, entry)` (0..1).
"""

from __future__ import annotations

import difflib
import random
from typing import Any

from .base import (
    Example,
    TaskOptionError,
    change_one_digit,
    check_option,
    check_split,
    draw_in_split,
)

PREFIX = "reasoning_gym:"


def _import_reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise TaskOptionError("task 'reasoning_gym:...' needs the reasoning-gym package "
                              "(pip install 'rlscale[tasks]')") from None
    return reasoning_gym


def _create(dataset: str, config: dict[str, Any]):
    """The reasoning-gym dataset, or a one-line TaskOptionError naming what is wrong."""
    from reasoning_gym.factory import DATASETS, create_dataset

    if dataset not in DATASETS:
        near = difflib.get_close_matches(dataset, DATASETS, n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else \
            f" ({len(DATASETS)} datasets; see reasoning_gym.factory.DATASETS)"
        raise TaskOptionError(f"unknown reasoning-gym dataset '{dataset}'{hint}")
    try:
        return create_dataset(dataset, **config)
    except (TypeError, ValueError, AssertionError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskOptionError(f"bad options for reasoning-gym dataset '{dataset}': {text}") from None


class ReasoningGymTask:
    """A reasoning-gym dataset behind the Task protocol (rlvr/tasks/base.py)."""

    def __init__(self, dataset: str, *, answer_tag: str | None = "answer",
                 test_share: float = 0.1, prompt_template: str = "{question}",
                 **config: Any) -> None:
        _import_reasoning_gym()
        self.name = f"{PREFIX}{dataset}"
        self.dataset_name = dataset
        self.answer_tag = answer_tag
        self.test_share = test_share
        self.prompt_template = prompt_template
        check_option(self.name, "test_share", test_share, float, 0, 1)
        if test_share >= 1:
            raise TaskOptionError(f"task '{self.name}' option test_share must be below 1 "
                                  "(the train split would be empty)")
        if answer_tag is not None and (not isinstance(answer_tag, str) or not answer_tag.isidentifier()):
            raise TaskOptionError(f"task '{self.name}' option answer_tag must be a tag name "
                                  f"such as answer, or null; got {str(answer_tag)[:40]!r}")
        if "{question}" not in prompt_template:
            raise TaskOptionError(f"task '{self.name}' option prompt_template must contain "
                                  "{question}")
        config.setdefault("size", 100_000)
        config.setdefault("seed", 0)
        self.config = config
        self._dataset = _create(dataset, config)

    # A verifier worker receives the task with every chunk: send the recipe, not the dataset;
    # a copy rebuilds it (milliseconds: entries are generated on access) when first needed.
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_dataset"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._dataset = None

    @property
    def dataset(self):
        if self._dataset is None:
            self._dataset = _create(self.dataset_name, self.config)
        return self._dataset

    def _generate(self, rng: random.Random) -> Example:
        index = rng.randrange(len(self.dataset))
        entry = self.dataset[index]
        prompt = self.prompt_template.format(question=entry["question"])
        return Example(prompt=prompt, answer=entry["answer"], meta={"entry": entry})

    def sample(self, split: str, rng: random.Random) -> Example:
        check_split(self.name, split)
        return draw_in_split(self._generate, split, rng, self.test_share)

    def extract_answer(self, completion: str) -> str | None:
        if self.answer_tag is None:
            return completion.strip()
        from reasoning_gym.utils import extract_answer

        return extract_answer(completion, tag_name=self.answer_tag)

    def verify(self, completion: str, example: Example) -> float:
        answer = self.extract_answer(completion)
        if answer is None:
            return 0.0
        return float(self.dataset.score_answer(answer, example.meta["entry"]))

    def demonstration(self, example: Example, rng: random.Random) -> str:
        answer = str(example.answer)
        return answer if self.answer_tag is None else \
            f"<{self.answer_tag}>{answer}</{self.answer_tag}>"

    def corrupt(self, example: Example, rng: random.Random) -> str:
        """A wrong or sloppy demonstration (`rlscale sft data.wrong_share`), even odds: the
        answer with one digit changed, in its tags; or the right answer with its tags broken
        (untagged, unclosed, or `answer: ...`), which the verifier does not accept. An answer
        without digits is always corrupted the second way."""
        answer, tag = str(example.answer), self.answer_tag
        wrong = change_one_digit(answer, rng)
        if tag is None:
            return wrong if wrong is not None else f"{answer} ?"
        if wrong is not None and rng.random() < 0.5:
            return f"<{tag}>{wrong}</{tag}>"
        return rng.choice([answer, f"<{tag}>{answer}", f"{tag}: {answer}"])
