"""Answer checkers for dataset tasks: `math_verify` (the default) and `exact`.

`math_verify` is Hugging Face's math-verify: both the reference and the completion are
parsed (LaTeX in `$...$`, `\\boxed{}` or bare, plain numbers and expressions) and compared
as mathematical objects, so `\\frac{1}{2}`, `0.5` and `$1/2$` are the same answer. Its own
signal-based timeouts are switched off: the verifier pool enforces the deadline (and alarm
signals only work on a process's main thread).
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any


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


def exact_match(completion: str, answer: Any) -> float:
    """1.0 when the stripped completion is the reference text exactly."""
    return 1.0 if completion.strip() == str(answer).strip() else 0.0


CHECKERS = {"math_verify": math_verify_match, "exact": exact_match}
