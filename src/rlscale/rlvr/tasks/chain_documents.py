"""Stand-alone documents for a base that has the skills of a step-by-step chain solution but
has never seen one (docs/emergence.md): the pretraining text of `data.documents`.

Two kinds, both in `long_arithmetic`'s line grammar and never next to a chain or an answer:

- `facts`: one to four unrelated one-operation facts, a line each, `432-96=336`, always
  right. The skill of a step line, out of any solution.
- `primers`: a fact followed by a check of it by the inverse operation, `432-96=336
  ?336+96=432 ok`; a fact written wrong (`step_error` of the time) is caught by its check
  (`no`) and written again until its check says `ok`. The behaviour of checking and redoing,
  out of any solution.

`multi_step_solution(text)` is the parser the tests run over every generated document: a
document holds a multi-step solution when it writes an intermediate result: a step line
that continues from the previous line's result (the running total of a chain; a redo, the
same total and operation again after a `no`, is not a continuation), or a worked line before
an answer tag whose result is not that answer. One line that works the whole chain and then
its answer (`47+385-96=336`, `<a>336</a>`) has no intermediate result.
"""

from __future__ import annotations

import random
import re

DOCUMENT_KINDS = ("facts", "primers")
MAX_FACTS = 4  # lines in a facts document
_NUM = r"-?[0-9]{1,12}"
_LINE = re.compile(rf"({_NUM})([+-])([0-9]{{1,12}})=({_NUM})(?: \?.*)?")
_WORKED = re.compile(rf"{_NUM}(?:[+-][0-9]{{1,12}})+=({_NUM})(?: \?.*)?")  # any ops
_ANSWER = re.compile(rf"<a>({_NUM})</a>")


def fact(total: int, sign: str, term: int) -> tuple[str, int]:
    """The line `total<sign>term=result` and its (right) result."""
    result = total + term if sign == "+" else total - term
    return f"{total}{sign}{term}={result}", result


def checked_step(total: int, sign: str, term: int, written: int, redo) -> tuple[list[str], int]:
    """A step with its check by the inverse operation, written again while the check says
    `no`: the lines and the result finally written. `written` is the first result written;
    `redo()` gives the result written at each retry (right, or a slip)."""
    lines = []
    back = "-" if sign == "+" else "+"
    while True:
        undone = written - term if sign == "+" else written + term
        verdict = "ok" if undone == total else "no"
        lines.append(f"{total}{sign}{term}={written} ?{written}{back}{term}={undone} {verdict}")
        if verdict == "ok":
            return lines, written
        written = redo()


def _operands(rng: random.Random, max_digits: int, sub_share: float) -> tuple[int, str, int]:
    """A running total (up to one digit more than a term) and one operation on it, drawn as a
    chain's steps are: subtraction only where the total allows it."""
    total = rng.randrange(10 ** rng.randint(1, max_digits + 1))
    term = rng.randrange(10 ** rng.randint(1, max_digits))
    sign = "-" if term <= total and rng.random() < sub_share else "+"
    return total, sign, term


def facts_document(rng: random.Random, max_digits: int, sub_share: float) -> str:
    """One to MAX_FACTS unrelated facts, one a line (none continues the line before it)."""
    lines: list[str] = []
    previous = None
    for _ in range(rng.randint(1, MAX_FACTS)):
        total, sign, term = _operands(rng, max_digits, sub_share)
        while total == previous:  # a line never starts from the result above it
            total, sign, term = _operands(rng, max_digits, sub_share)
        line, previous = fact(total, sign, term)
        lines.append(line)
    return "\n".join(lines)


def primer_document(rng: random.Random, max_digits: int, sub_share: float, step_error: float,
                    slip) -> str:
    """One fact and its check, redone until the check says `ok` (`slip(value, rng)` writes
    a wrong result, with probability `step_error` at each try)."""
    total, sign, term = _operands(rng, max_digits, sub_share)
    exact = total + term if sign == "+" else total - term

    def write() -> int:
        return slip(exact, rng) if rng.random() < step_error else exact

    lines, _ = checked_step(total, sign, term, write(), write)
    return "\n".join(lines)


def multi_step_solution(text: str) -> bool:
    """Whether `text` holds a multi-step solution: a step line that starts from the result
    of the step line above it (not a redo of it), or a worked line whose result is not the
    answer the text then gives."""
    previous: tuple[int, str, int, int] | None = None
    results: list[int] = []
    for raw in text.split("\n"):
        line = raw.strip()
        answer = _ANSWER.fullmatch(line)
        if answer is not None:
            if any(result != int(answer[1]) for result in results):
                return True
            results = []
        worked = _WORKED.fullmatch(line)
        if worked is not None:
            results.append(int(worked[1]))
        match = _LINE.fullmatch(line)
        if match is None:
            previous = None
            continue
        step = (int(match[1]), match[2], int(match[3]), int(match[4]))
        if previous is not None and step[0] == previous[3] and step[:3] != previous[:3]:
            return True
        previous = step
    return False
