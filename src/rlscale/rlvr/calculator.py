"""Exact arithmetic on integers and rationals, parsed by hand: the `calculator` tool.

Grammar (whitespace between tokens is ignored):

    expression := term (("+" | "-") term)*
    term       := unary (("*" | "/") unary)*
    unary      := ("+" | "-") unary | power
    power      := atom (("^" | "**") unary)?      right-associative; -2^2 = -4
    atom       := number | "(" expression ")"
    number     := digits ["." digits]             1.5 is exactly 3/2

No code is evaluated. The result is an integer (`432`) or a reduced fraction (`-3/4`). Sizes
are bounded so that no call can run long: the expression's length, its nesting, and powers
(an integer exponent, and a result of at most MAX_RESULT_BITS bits).
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_CHARS = 1000
MAX_DEPTH = 50
MAX_RESULT_BITS = 10_000  # ~3,000 digits

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(\*\*|[-+*/^()]))")


class CalculatorError(ValueError):
    """A failed call: bad syntax, division by zero, a result too large (one line)."""


def _tokens(expression: str) -> list[tuple[str, int]]:
    out, at = [], 0
    while at < len(expression):
        match = _TOKEN.match(expression, at)
        if match is None:
            rest = expression[at:].lstrip()
            if not rest:
                break
            raise CalculatorError(f"unexpected character {rest[0]!r} at position "
                                  f"{len(expression) - len(rest)}")
        token = match[1] or ("^" if match[2] == "**" else match[2])
        out.append((token, match.start(match.lastindex)))
        at = match.end()
    return out


class _Parser:
    def __init__(self, expression: str):
        self.tokens = _tokens(expression)
        self.at = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.at][0] if self.at < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise CalculatorError("unexpected end of expression")
        self.at += 1
        return token

    def fail(self) -> CalculatorError:
        token, position = self.tokens[self.at]
        return CalculatorError(f"unexpected {token!r} at position {position}")

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value *= self.unary()
            else:
                divisor = self.unary()
                if divisor == 0:
                    raise CalculatorError("division by zero")
                value /= divisor
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("+", "-"):
            sign = self.take()
            self.nest()
            value = self.unary()
            self.depth -= 1
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take()
        self.nest()
        exponent = self.unary()
        self.depth -= 1
        return _power(base, exponent)

    def atom(self) -> Fraction:
        token = self.peek()
        if token == "(":
            self.take()
            self.nest()
            value = self.expression()
            self.depth -= 1
            if self.peek() != ")":
                raise self.fail() if self.peek() is not None else CalculatorError("missing ')'")
            self.take()
            return value
        if token is None:
            raise CalculatorError("unexpected end of expression")
        if not token[0].isdigit():
            raise self.fail()
        self.take()
        return Fraction(token)

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalculatorError(f"nested deeper than {MAX_DEPTH}")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalculatorError(f"exponent {exponent} is not an integer")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length()) * abs(exponent)
    if base not in (0, 1, -1) and bits > MAX_RESULT_BITS:
        raise CalculatorError(f"result larger than {MAX_RESULT_BITS} bits")
    return base ** int(exponent)


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression`; raises CalculatorError (one line)."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    parser = _Parser(expression)
    if not parser.tokens:
        raise CalculatorError("empty expression")
    value = parser.expression()
    if parser.peek() is not None:
        raise parser.fail()
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_RESULT_BITS:
        raise CalculatorError(f"result larger than {MAX_RESULT_BITS} bits")
    return value


def format_value(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else \
        f"{value.numerator}/{value.denominator}"


def calculate(expression: str) -> str:
    """`evaluate`, formatted: "432", "-3/4"."""
    return format_value(evaluate(expression))
