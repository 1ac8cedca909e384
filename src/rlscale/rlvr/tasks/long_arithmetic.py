"""Long arithmetic with reasoning traces: a chain of additions and subtractions, worked out
step by step in free text, with only the final answer (in a tag) verified.

Prompt `"47+385-96+710="`. A completion is a trace the model writes as it likes, then
`<a>1046</a>`; the verifier reads the one answer tag at the end and nothing else, so how long
the trace is, and whether there is one at all, is the model's choice. The grammar the
demonstrations use (each line ends with a newline):

    47+385=432                    a step: one operation on the running total
    432-96=336 ?336+96=432 ok     a step with its check: the inverse operation, compared
    432-96=346 ?346+96=442 no     a check that fails ...
    432-96=336 ?336+96=432 ok     ... and the step done again (a backtrack)
    47+385-96=336                 a combined step: two operations at once (error-prone)
    <a>1046</a>                   the answer (a guess when no step comes before it)

Demonstrations come from a program with deliberately imperfect strategies (`STRATEGIES`):
it guesses the answer outright, combines two operations per line, works one operation per
line without checking, or checks every step and redoes the ones whose check fails. Each
computed result is wrong with probability `step_error` (one digit changed), and a guess is
wrong half of the time, so a share of the demonstrations end in a wrong answer and the best
behaviour (check everything on long chains) is not the average one.

Difficulty: the number of terms (`min_terms`..`max_terms`) and digits per term (1..
`max_digits`); `meta["terms"]` is the difficulty of an example. The running total never goes
below zero.

Splits: `train` and `test` hash-split the prompts whose terms never contain the digit 7.
`ood` is a rule change, not a size change: every ood prompt has at least one term with the
digit 7 (same term counts, digits and totals), a number pattern no train or test prompt has,
so no ood prompt was ever seen in SFT or RL (the digit itself is familiar from results).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import ClassVar

from .base import OOD, Example, TaskOptionError, check_option, check_split, draw_in_split
from .chain_documents import DOCUMENT_KINDS, checked_step, facts_document, primer_document

ANSWER_OPEN, ANSWER_CLOSE = "<a>", "</a>"
# Numbers of at most 12 digits (int() of a huge digit string is slow, and refused past 4300);
# a slip not caught can take a running total below zero, so lines may carry a minus sign.
_NUM = r"-?[0-9]{1,12}"
_ANSWER = re.compile(rf"<a>({_NUM})</a>\s*\Z")
_TAG = re.compile(r"</?a>")
# A step: total, then one or more (op, term), '=', result; an optional check clause.
_STEP = re.compile(rf"({_NUM})((?:[+-][0-9]{{1,12}})+)=({_NUM})"
                   rf"(?: \?({_NUM})([+-])([0-9]{{1,12}})=({_NUM}) (ok|no))?")
_TERM = re.compile(r"([+-])([0-9]{1,12})")
# A step the calculator did (rollout.tools: [calculator], the default markup): the call, then
# its result as the tool wrote it.
CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE = "<c>", "</c>", "<r>", "</r>"
_TOOL_STEP = re.compile(rf"<c>({_NUM})((?:[+-][0-9]{{1,12}})+)</c><r>({_NUM})</r>")
FORBIDDEN_DIGIT = "7"  # the ood rule: only ood prompts have a term with this digit

# (name, share of the demonstrations) -- see the module docstring.
STRATEGIES: tuple[tuple[str, float], ...] = (
    ("guess", 0.2), ("combine", 0.25), ("plain", 0.25), ("careful", 0.3), ("whole", 0.0))


@dataclass(frozen=True)
class TraceCounters:
    """What a completion did, read off its text with the demonstrations' grammar."""

    steps: int = 0        # lines of one operation
    combined: int = 0     # lines of two or more operations at once
    checks: int = 0       # check clauses
    backtracks: int = 0   # checks that said "no" (the step is then redone)
    wrong_steps: int = 0  # lines whose arithmetic is wrong
    other_lines: int = 0  # lines outside the grammar
    answered: bool = False
    missed_slips: int = 0  # checks that said "ok" to a wrong step
    false_alarms: int = 0  # checks that said "no" to a right step
    tool_steps: int = 0   # lines the calculator worked out (a call and its result)
    true_alarms: int = 0  # checks that said "no" to a wrong step
    redos: int = 0        # steps written again after their check said "no"
    # worked lines whose result is not the answer written (all of them without an answer):
    # intermediate results; a single line that works the whole chain is not one
    intermediate_lines: int = 0
    corrected: int = 0    # right redos of a wrong step whose check said "no": slips fixed

    @property
    def guessed(self) -> bool:
        """An answer with no worked line before it."""
        return self.answered and not self.worked

    @property
    def worked(self) -> bool:
        """At least one worked line (an intermediate result)."""
        return self.steps + self.combined + self.tool_steps > 0

    def as_metrics(self) -> dict[str, float]:
        lines = self.steps + self.combined
        return {"steps": self.steps, "combined_steps": self.combined, "checks": self.checks,
                "backtracks": self.backtracks, "wrong_steps": self.wrong_steps,
                "ungrammatical_lines": self.other_lines, "guess": float(self.guessed),
                "checked_step_share": self.checks / lines if lines else 0.0,
                "no_answer": float(not self.answered), "missed_slips": self.missed_slips,
                "false_alarms": self.false_alarms, "tool_steps": self.tool_steps,
                "true_alarms": self.true_alarms, "redos": self.redos,
                "intermediate_lines": self.intermediate_lines,
                "intermediate": float(self.intermediate_lines > 0),
                "corrected_slips": self.corrected}


def count_behaviour(completion: str) -> TraceCounters:
    """The behaviour counters of one completion (any text: unknown lines are counted)."""
    steps = combined = checks = backtracks = wrong = other = missed = false_alarms = 0
    tool_steps = true_alarms = redos = corrected = 0
    answered, answer = False, None
    results: list[int] = []  # of the worked lines
    rejected = None  # the (total, operations) of the line above when its check said "no"
    rejected_slip = False  # ... and whether that line was wrong
    for line in completion.strip().split("\n"):
        line = line.strip()
        if not line:
            continue
        if (tagged := _ANSWER.fullmatch(line)) is not None:
            answered, answer = True, int(tagged[1])
            continue
        if (called := _TOOL_STEP.fullmatch(line)) is not None:
            tool_steps += 1
            results.append(int(called[3]))
            continue
        match = _STEP.fullmatch(line)
        if match is None:
            other += 1
            continue
        total, ops, result = int(match[1]), _TERM.findall(match[2]), int(match[3])
        results.append(result)
        value = total
        for sign, term in ops:
            value = value + int(term) if sign == "+" else value - int(term)
        slipped = value != result
        redo = rejected == (total, ops)
        redos += redo
        corrected += redo and rejected_slip and not slipped
        rejected, rejected_slip = ((total, ops), slipped) if match[8] == "no" else (None, False)
        if len(ops) == 1:
            steps += 1
        else:
            combined += 1
        wrong += slipped
        if match[4] is not None:
            checks += 1
            backtracks += match[8] == "no"
            missed += slipped and match[8] == "ok"
            false_alarms += not slipped and match[8] == "no"
            true_alarms += slipped and match[8] == "no"
    intermediate = sum(result != answer for result in results)
    return TraceCounters(steps, combined, checks, backtracks, wrong, other, answered, missed,
                         false_alarms, tool_steps, true_alarms, redos, intermediate,
                         corrected)


def chained_lines(completion: str, example: Example) -> int:
    """The lines that work the prompt's chain in order: one operation, the prompt's next one,
    on the running total (its first term, then the result the line before wrote). A line
    whose check says "no" does not advance the chain (its redo does)."""
    total, ops = example.meta["first"], list(example.meta["ops"])
    done = 0
    for line in completion.strip().split("\n"):
        match = _STEP.fullmatch(line.strip())
        if match is None or done >= len(ops):
            continue
        terms = _TERM.findall(match[2])
        sign, term = ops[done]
        if len(terms) == 1 and int(match[1]) == total and terms[0] == (sign, str(term)) \
                and match[8] != "no":
            total, done = int(match[3]), done + 1
    return done


def parse_answer(completion: str) -> int | None:
    """The integer in the one answer tag that ends the completion, else None."""
    text = completion.strip()
    if len(_TAG.findall(text)) != 2:
        return None
    match = _ANSWER.search(text)
    return int(match[1]) if match else None


@dataclass
class LongArithmeticTask:
    name: str = "long_arithmetic"
    document_kinds: ClassVar[tuple[str, ...]] = DOCUMENT_KINDS
    # The completion budget its traces need (the longest demonstrations are ~240 characters):
    # the reasoning recipe's rollout.max_new_tokens, rlvr eval's default.
    max_new_tokens: ClassVar[int] = 256
    min_terms: int = 2
    max_terms: int = 6
    max_digits: int = 3
    sub_share: float = 0.4      # of the operations after the first term (where the total allows)
    step_error: float = 0.1     # the demonstrator's chance of a wrong result per computed step
    # The demonstrator's chance of handing a step to the calculator instead (a call and its
    # exact result), at random whatever the difficulty: for rollout.tools [calculator].
    tool_share: float = 0.0
    strategies: dict[str, float] = field(default_factory=lambda: dict(STRATEGIES))
    test_share: float = 0.1

    def __post_init__(self) -> None:
        check_option(self.name, "min_terms", self.min_terms, int, 2, 12)
        check_option(self.name, "max_terms", self.max_terms, int, self.min_terms, 12)
        check_option(self.name, "max_digits", self.max_digits, int, 1, 6)
        check_option(self.name, "sub_share", self.sub_share, float, 0, 1)
        check_option(self.name, "step_error", self.step_error, float, 0, 1)
        check_option(self.name, "tool_share", self.tool_share, float, 0, 1)
        check_option(self.name, "test_share", self.test_share, float, 0, 1)
        if self.test_share >= 1:
            raise TaskOptionError(f"task '{self.name}' option test_share must be below 1 "
                                  "(the train split would be empty)")
        known = {name for name, _ in STRATEGIES}
        if not isinstance(self.strategies, dict) or not self.strategies \
                or set(self.strategies) - known:
            raise TaskOptionError(f"task '{self.name}' option strategies must map some of "
                                  f"{', '.join(sorted(known))} to shares, got {self.strategies!r}")
        for name, share in self.strategies.items():
            check_option(self.name, f"strategies.{name}", share, float, 0)
        if sum(self.strategies.values()) <= 0:
            raise TaskOptionError(f"task '{self.name}' option strategies: the shares sum to 0")

    # -- prompts ---------------------------------------------------------------------------
    def _term(self, rng: random.Random, allow_seven: bool) -> int:
        while True:
            value = rng.randrange(10 ** rng.randint(1, self.max_digits))
            if allow_seven or FORBIDDEN_DIGIT not in str(value):
                return value

    def _generate(self, rng: random.Random, ood: bool = False) -> Example:
        terms_count = rng.randint(self.min_terms, self.max_terms)
        while True:
            terms = [self._term(rng, allow_seven=ood) for _ in range(terms_count)]
            if not ood or any(FORBIDDEN_DIGIT in str(t) for t in terms):
                break
        total, ops = terms[0], []
        for term in terms[1:]:
            sign = "-" if term <= total and rng.random() < self.sub_share else "+"
            total = total + term if sign == "+" else total - term
            ops.append((sign, term))
        prompt = str(terms[0]) + "".join(f"{s}{t}" for s, t in ops) + "="
        return Example(prompt=prompt, answer=total,
                       meta={"first": terms[0], "ops": ops, "terms": terms_count})

    def sample(self, split: str, rng: random.Random) -> Example:
        check_split(self.name, split, ood=True)
        if split == OOD:
            return self._generate(rng, ood=True)
        return draw_in_split(self._generate, split, rng, self.test_share)

    # -- scoring ---------------------------------------------------------------------------
    def verify(self, completion: str, example: Example) -> float:
        return 1.0 if parse_answer(completion) == example.answer else 0.0

    def behaviour(self, completion: str, example: Example) -> dict[str, float]:
        return {**count_behaviour(completion).as_metrics(),
                "chained_lines": chained_lines(completion, example)}

    @staticmethod
    def difficulty(example: Example) -> int:
        return example.meta["terms"]

    # -- demonstrations --------------------------------------------------------------------
    def demonstration(self, example: Example, rng: random.Random) -> str:
        names = list(self.strategies)
        strategy = rng.choices(names, weights=[self.strategies[n] for n in names])[0]
        return self.demonstrate(example, strategy, rng)

    def demonstrate(self, example: Example, strategy: str, rng: random.Random) -> str:
        """A trace of `strategy` (one of STRATEGIES), with the demonstrator's slips."""
        total, ops = example.meta["first"], list(example.meta["ops"])
        lines: list[str] = []
        if strategy == "guess":
            answer = example.answer if rng.random() < 0.5 else _slip(example.answer, rng)
            return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
        chunk = {"combine": 2, "whole": len(ops)}.get(strategy, 1)
        for i in range(0, len(ops), chunk):
            part = ops[i:i + chunk]
            exact = total + sum(t if s == "+" else -t for s, t in part)
            if self.tool_share and rng.random() < self.tool_share:
                expression = str(total) + "".join(f"{s}{t}" for s, t in part)
                lines.append(f"{CALL_OPEN}{expression}{CALL_CLOSE}"
                             f"{RESULT_OPEN}{exact}{RESULT_CLOSE}")
                total = exact
                continue
            def write(exact: int = exact) -> int:
                return _slip(exact, rng) if rng.random() < self.step_error else exact

            written = write()
            if strategy == "careful":
                (sign, term), = part
                checked, written = checked_step(total, sign, term, written, write)
                lines.extend(checked)
            else:
                lines.append(str(total) + "".join(f"{s}{t}" for s, t in part) + f"={written}")
            total = written  # a slip not caught carries on
        lines.append(f"{ANSWER_OPEN}{total}{ANSWER_CLOSE}")
        return "\n".join(lines)

    def document(self, kind: str, rng: random.Random) -> str:
        """A stand-alone pretraining document of `kind` (`DOCUMENT_KINDS`; chain_documents):
        single-step facts, or a fact with its check, never in a solution."""
        if kind == "facts":
            return facts_document(rng, self.max_digits, self.sub_share)
        if kind == "primers":
            return primer_document(rng, self.max_digits, self.sub_share, self.step_error, _slip)
        raise TaskOptionError(f"task '{self.name}' has no '{kind}' documents "
                              f"(known: {', '.join(DOCUMENT_KINDS)})")

    def direct_demonstration(self, example: Example, rng: random.Random) -> str:
        """The answer alone, always right: the no-trace baseline's demonstrations."""
        return f"{ANSWER_OPEN}{example.answer}{ANSWER_CLOSE}"


def _slip(value: int, rng: random.Random) -> int:
    """`value` with one digit changed (the sign kept; never the same value)."""
    text = str(abs(value))
    i = rng.randrange(len(text))
    choices = [d for d in "0123456789" if d != text[i] and not (i == 0 and d == "0" and len(text) > 1)]
    slipped = int(text[:i] + rng.choice(choices) + text[i + 1:])
    return -slipped if value < 0 else slipped
