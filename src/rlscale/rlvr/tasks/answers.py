"""Answer checkers for dataset tasks: `math_verify` (the default), `last_number` and `exact`.

`last_number` reads the last number a free-text completion writes (`"... = 432."`,
`\\boxed{432}`, `"1,234"`): what an instruct model's sentence answers end with. Unlike
math-verify it does not evaluate what it finds, so a completion that restates the question
(`"4 + 3"`, which math-verify scores as 7) is not credited.

`math_verify` is Hugging Face's math-verify: both the reference and the completion are
parsed (LaTeX in `$...$`, `\\boxed{}` or bare, plain numbers and expressions) and compared
as mathematical objects, so `\\frac{1}{2}`, `0.5` and `$1/2$` are the same answer. Its own
signal-based timeouts are switched off: the verifier pool enforces the deadline (and alarm
signals only work on a process's main thread).
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any

# ASCII digits (`\d` also takes other scripts' digits); thousands commas inside a number.
_NUMBER = re.compile(r"-?[0-9]+(?:,[0-9]{3})*(?:\.[0-9]+)?")


class MissingPackageError(ValueError):
    pass


def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise MissingPackageError("verifier 'math_verify' needs the math-verify package "
                                  "(pip install 'rlscale[tasks]')") from None
    # It warns on every call that timeouts are off; here that is by design (see above).
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return math_verify


@lru_cache(maxsize=4096)
def _parse_reference(answer: str):
    mv = _math_verify()
    # A bare reference such as `\frac12` parses only inside math delimiters.
    return mv.parse(answer, parsing_timeout=None) or mv.parse(f"${answer}$", parsing_timeout=None)


def math_verify_match(completion: str, answer: Any) -> float:
    """1.0 when the completion's answer equals the reference mathematically, else 0.0."""
    mv = _math_verify()
    gold = _parse_reference(str(answer))
    if not gold:
        raise ValueError(f"math-verify cannot parse the reference answer {str(answer)[:60]!r}")
    predicted = mv.parse(completion, parsing_timeout=None)
    return 1.0 if predicted and mv.verify(gold, predicted, timeout_seconds=None) else 0.0


def last_number(text: str) -> int | float | None:
    """The last number written in `text` (an int, or a float with a decimal point), else
    None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    value = found[-1].replace(",", "")
    return float(value) if "." in value else int(value)


def last_number_match(completion: str, answer: Any) -> float:
    """1.0 when the completion's last number equals the reference's value."""
    predicted = last_number(completion)
    if predicted is None:
        return 0.0
    try:
        return 1.0 if float(predicted) == float(str(answer).replace(",", "")) else 0.0
    except ValueError:
        raise ValueError(f"last_number needs a numeric reference answer, got "
                         f"{str(answer)[:60]!r}") from None


def exact_match(completion: str, answer: Any) -> float:
    """1.0 when the stripped completion is the reference text exactly."""
    return 1.0 if completion.strip() == str(answer).strip() else 0.0


CHECKERS = {"math_verify": math_verify_match, "last_number": last_number_match,
            "exact": exact_match}
