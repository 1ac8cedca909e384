"""Multi-digit addition and multiplication, in two styles.

`style: bare` (the default, for the models rlscale builds): prompt `"347+85="`; the
completion is the decimal result and nothing else (the end-of-sequence token ends it), e.g.
`"432"`. The verifier accepts exactly that, so a sloppy completion (`"432 ok"`, `"=432"`)
scores 0: format is part of correctness.

`style: question` (for pretrained instruct models, which answer in sentences): prompt
`"What is 347 + 85?"`; the answer is the last number the completion writes
(`answers.last_number`), so `"347 + 85 = 432."` and `"The answer is \boxed{432}"` score 1,
while restating the question (`"347 + 85"`) scores 0.

`style: story` (the same, harder to read): the sum or product told as a one-sentence word
problem about someone's things, `"Maria has 4 shells and finds 7 more. How many shells does
Maria have now?"`, drawn from a few templates, names and objects; scored as `question`. A
held-out story is a new sentence, though its sum may appear in training in other words.

Splits: `train` and `test` hash-split the prompts above. `ood` is one digit longer than
training ever shows, so no ood prompt is a train or test prompt: a sum has one operand
(a or b, even odds) of exactly add_digits+1 digits and the other of 1..add_digits+1
digits; a product's first operand has exactly mul_digits[0]+1 digits and its second
1..mul_digits[1] digits as in training (the same mul_share of products).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import ClassVar, Literal

from .answers import last_number
from .base import OOD, Example, TaskOptionError, check_option, check_split, draw_in_split

# ASCII digits only: `\d` would also accept other scripts' digits, which int() parses.
_ANSWER = re.compile(r"-?[0-9]+")


@dataclass
class ArithmeticTask:
    name: str = "arithmetic"
    # The completion budget its answers need (bare: 4 characters and EOS at the default
    # digits, a character a token of the tiny presets; question: a sentence or a short
    # working): the quickstart recipes', rlvr eval's default.
    BUDGETS: ClassVar[dict[str, int]] = {"bare": 8, "question": 64, "story": 64}
    add_digits: int = 3         # addition operands have 1..add_digits digits
    mul_digits: tuple[int, int] = (2, 1)  # multiplication: (digits of a, digits of b)
    mul_share: float = 0.3
    test_share: float = 0.1
    style: Literal["bare", "question", "story"] = "bare"

    @property
    def max_new_tokens(self) -> int:
        return self.BUDGETS[self.style]

    def _example(self, a: int, op: str, b: int, result: int, rng: random.Random) -> Example:
        if self.style == "story":
            return Example(prompt=story(a, op, b, rng), answer=result,
                           meta={"op": op, "terms": (a, b)})
        prompt = f"{a}{op}{b}=" if self.style == "bare" else f"What is {a} {op} {b}?"
        return Example(prompt=prompt, answer=result, meta={"op": op})

    def __post_init__(self) -> None:
        if self.style not in self.BUDGETS:
            raise TaskOptionError(f"task '{self.name}' option style must be one of "
                                  f"{', '.join(self.BUDGETS)}, got {str(self.style)[:40]!r}")
        check_option(self.name, "add_digits", self.add_digits, int, 1, 18)
        if isinstance(self.mul_digits, list):
            self.mul_digits = tuple(self.mul_digits)  # YAML gives a list
        if not isinstance(self.mul_digits, tuple) or len(self.mul_digits) != 2:
            raise TaskOptionError(f"task '{self.name}' option mul_digits must be two integers, "
                                  f"got {str(self.mul_digits)[:40]!r}")
        for digits in self.mul_digits:
            check_option(self.name, "mul_digits", digits, int, 1, 18)
        check_option(self.name, "mul_share", self.mul_share, float, 0, 1)
        check_option(self.name, "test_share", self.test_share, float, 0, 1)
        if self.test_share >= 1:
            raise TaskOptionError(f"task '{self.name}' option test_share must be below 1 "
                                  "(the train split would be empty)")

    def _generate(self, rng: random.Random) -> Example:
        if rng.random() < self.mul_share:
            a = rng.randrange(1, 10 ** self.mul_digits[0])
            b = rng.randrange(1, 10 ** self.mul_digits[1])
            op, result = "*", a * b
        else:
            a = rng.randrange(0, 10 ** rng.randint(1, self.add_digits))
            b = rng.randrange(0, 10 ** rng.randint(1, self.add_digits))
            op, result = "+", a + b
        return self._example(a, op, b, result, rng)

    def _generate_ood(self, rng: random.Random) -> Example:
        """One digit more than `_generate` ever draws (see the module docstring)."""
        if rng.random() < self.mul_share:
            a = _exact_digits(rng, self.mul_digits[0] + 1)
            b = rng.randrange(1, 10 ** self.mul_digits[1])
            op, result = "*", a * b
        else:
            long = _exact_digits(rng, self.add_digits + 1)
            other = rng.randrange(0, 10 ** rng.randint(1, self.add_digits + 1))
            a, b = (long, other) if rng.random() < 0.5 else (other, long)
            op, result = "+", a + b
        return self._example(a, op, b, result, rng)

    def sample(self, split: str, rng: random.Random) -> Example:
        check_split(self.name, split, ood=True)
        if split == OOD:
            return self._generate_ood(rng)
        return draw_in_split(self._generate, split, rng, self.test_share)

    def verify(self, completion: str, example: Example) -> float:
        if self.style != "bare":
            return 1.0 if last_number(completion) == example.answer else 0.0
        text = completion.strip()
        return 1.0 if _ANSWER.fullmatch(text) and int(text) == example.answer else 0.0

    def demonstration(self, example: Example, rng: random.Random) -> str:
        if self.style == "story":
            a, b = example.meta["terms"]
            return f"{a} {example.meta['op']} {b} = {example.answer}"
        if self.style == "question":
            return f"{example.prompt[len('What is '):-1]} = {example.answer}"
        return str(example.answer)

    def corrupt(self, example: Example, rng: random.Random) -> str:
        """A plausible wrong or sloppy trace: one digit changed, or the format broken (even odds)."""
        text = str(example.answer)
        if rng.random() < 0.5:
            i = rng.randrange(len(text))
            digit = rng.choice([d for d in "0123456789" if d != text[i]])
            return text[:i] + digit + text[i + 1:]
        return rng.choice([f"{text} ok", f"={text}", f"{text}{text[-1]}", f"{text}."])


def _exact_digits(rng: random.Random, digits: int) -> int:
    """A uniform integer of exactly `digits` decimal digits."""
    return rng.randrange(10 ** (digits - 1), 10 ** digits)


NAMES = ("Tom", "Anna", "Ben", "Maria", "Sam", "Lucy", "Omar", "Mei", "Jack", "Sara")
THINGS = ("apples", "books", "stamps", "marbles", "pencils", "cookies", "shells", "cards",
          "flowers", "coins")
SUM_STORIES = (
    "{name} has {a} {things} and gets {b} more. How many {things} does {name} have now?",
    "There are {a} {things} in a box and {b} {things} on the table. How many {things} are "
    "there in all?",
    "{name} found {a} {things} in the morning and {b} in the afternoon. How many {things} "
    "did {name} find?",
    "A shelf holds {a} {things}. {name} puts {b} more on it. How many {things} are on the "
    "shelf now?",
)
PRODUCT_STORIES = (
    "{name} buys {a} bags with {b} {things} in each. How many {things} is that?",
)


def story(a: int, op: str, b: int, rng: random.Random) -> str:
    """A one-sentence word problem whose answer is `a op b` (+ or *)."""
    template = rng.choice(SUM_STORIES if op == "+" else PRODUCT_STORIES)
    return template.format(a=a, b=b, name=rng.choice(NAMES), things=rng.choice(THINGS))
