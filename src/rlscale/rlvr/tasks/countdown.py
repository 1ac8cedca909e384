"""Countdown: reach a target from the given numbers with + - * / (each number at most once).

The verifier parses the expression with `ast` and walks the tree itself, accepting only
integer literals and the four binary operators, with exact rational arithmetic: no `eval`,
no names, no calls, no powers, so nothing a model writes can run.

Splits: `train` and `test` hash-split puzzles of `count` numbers. `ood` puzzles have
count+1 numbers (the same number range and target rules: 1..max_number each, a target
built from all of them in 1..max_target), so no ood prompt is a train or test prompt.
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from .base import OOD, Example, TaskOptionError, check_option, check_split, draw_in_split

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
# Python's grammar is wider than the answer format: a `# comment` would let free text ride
# along with a correct answer, and `0x10` / `1_6` would spell a given number differently.
_ALLOWED = frozenset("0123456789+-*/() \n")


class ExpressionError(ValueError):
    pass


def evaluate_expression(text: str, max_length: int = 200) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the integer literals it uses."""
    if len(text) > max_length:
        raise ExpressionError("expression too long")
    if not set(text) <= _ALLOWED:
        raise ExpressionError("only digits, + - * / and parentheses are allowed")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ExpressionError("not an arithmetic expression") from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ExpressionError("division by zero")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise ExpressionError(f"disallowed syntax: {type(node).__name__}")

    return walk(tree.body), used


def solve(numbers: list[int], target: int) -> str | None:
    """An expression reaching `target` using each number at most once, or None."""
    items = [(Fraction(n), str(n)) for n in numbers]

    def search(pool):
        for value, expr in pool:
            if value == target:
                return expr
        for i in range(len(pool)):
            for j in range(len(pool)):
                if i == j:
                    continue
                (a, ea), (b, eb) = pool[i], pool[j]
                rest = [pool[k] for k in range(len(pool)) if k not in (i, j)]
                cands = [(a + b, f"({ea}+{eb})"), (a - b, f"({ea}-{eb})"), (a * b, f"({ea}*{eb})")]
                if b != 0:
                    cands.append((a / b, f"({ea}/{eb})"))
                for cand in cands:
                    found = search([cand, *rest])
                    if found:
                        return found
        return None

    found = search(items)
    if found is None:
        return None
    # Drop redundant outer parentheses for a cleaner demonstration.
    return found[1:-1] if found.startswith("(") and found.endswith(")") and _balanced(found[1:-1]) else found


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


@dataclass
class CountdownTask:
    name: str = "countdown"
    # The completion budget its answers need: the longest expression of an ood puzzle (one
    # number more) is 15 characters, then EOS; rlvr eval's default.
    max_new_tokens: ClassVar[int] = 16
    count: int = 3            # numbers per puzzle
    max_number: int = 20
    max_target: int = 100
    test_share: float = 0.1
    max_tries: int = 10_000   # draws of numbers per puzzle before giving up

    def __post_init__(self) -> None:
        check_option(self.name, "count", self.count, int, 1, 6)
        check_option(self.name, "max_number", self.max_number, int, 1, 10**6)
        check_option(self.name, "max_target", self.max_target, int, 1, 10**9)
        check_option(self.name, "test_share", self.test_share, float, 0, 1)
        check_option(self.name, "max_tries", self.max_tries, int, 1)
        if self.test_share >= 1:
            raise TaskOptionError(f"task '{self.name}' option test_share must be below 1 "
                                  "(the train split would be empty)")

    def _generate(self, rng: random.Random, count: int | None = None) -> Example:
        """A puzzle of `count` numbers (default `self.count`)."""
        count = self.count if count is None else count
        # Build the target from the numbers so every puzzle has a solution.
        for _ in range(self.max_tries):
            numbers = [rng.randint(1, self.max_number) for _ in range(count)]
            value = Fraction(numbers[0])
            for n in numbers[1:]:
                op = rng.choice("+-*")
                value = value + n if op == "+" else value - n if op == "-" else value * n
            if value.denominator == 1 and 0 < value <= self.max_target:
                break
        else:  # e.g. count=1 with max_number above max_target only rarely fits
            raise TaskOptionError(
                f"task '{self.name}' cannot make a puzzle with count={count}"
                f"{' (the ood split: count+1)' if count != self.count else ''}, max_number="
                f"{self.max_number}, max_target={self.max_target} in {self.max_tries} tries")
        target = int(value)
        shown = sorted(numbers)
        prompt = f"{' '.join(map(str, shown))}->{target}:"
        return Example(prompt=prompt, answer=target, meta={"numbers": shown})

    def sample(self, split: str, rng: random.Random) -> Example:
        check_split(self.name, split, ood=True)
        if split == OOD:
            return self._generate(rng, self.count + 1)
        return draw_in_split(self._generate, split, rng, self.test_share)

    def verify(self, completion: str, example: Example) -> float:
        try:
            value, used = evaluate_expression(completion)
        except ExpressionError:
            return 0.0
        if Counter(used) - Counter(example.meta["numbers"]):
            return 0.0  # used a number not given, or one more often than given
        return 1.0 if value == example.answer else 0.0

    def demonstration(self, example: Example, rng: random.Random) -> str:
        found = solve(example.meta["numbers"], example.answer)
        if found is None:  # unreachable: targets are built from their numbers
            raise ValueError(f"no solution for {example.prompt}")
        return found

    def corrupt(self, example: Example, rng: random.Random) -> str:
        good = self.demonstration(example, rng)
        return good.replace("+", "-", 1) if "+" in good else good + "+1"
