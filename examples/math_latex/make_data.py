"""Write `examples/math_latex/problems.jsonl`: small math questions with LaTeX answers.

Run from the repository root: `python examples/math_latex/make_data.py` (deterministic; the
file it writes is checked in). Three kinds of question, each answer in LaTeX as a math
dataset would give it, so the math-verify verifier has to compare values, not strings:
a model that answers `3.5` to "Halve 7." is right (`\\frac{7}{2}`), as is `\\frac{10}{8}`
to "3/8 + 7/8" (`\\frac{5}{4}`).
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path


def latex(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def problem(rng: random.Random) -> dict[str, str]:
    kind = rng.choice(["add", "halve", "fractions"])
    if kind == "add":
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return {"prompt": f"Compute {a} + {b}.", "answer": f"${a + b}$", "kind": kind}
    if kind == "halve":
        a = rng.randint(1, 99)
        return {"prompt": f"Halve {a}.", "answer": f"${latex(Fraction(a, 2))}$", "kind": kind}
    d = rng.randint(2, 9)
    a, b = rng.randint(1, d - 1), rng.randint(1, d - 1)
    return {"prompt": f"Add {a}/{d} + {b}/{d}.", "answer": f"${latex(Fraction(a + b, d))}$",
            "kind": kind}


def main(out: Path = Path(__file__).with_name("problems.jsonl"), n: int = 2000) -> None:
    rng = random.Random(0)
    seen: dict[str, dict[str, str]] = {}
    while len(seen) < n:
        row = problem(rng)
        seen.setdefault(row["prompt"], row)
    out.write_text("".join(json.dumps(row) + "\n" for row in seen.values()))
    print(f"wrote {len(seen)} problems to {out}")


if __name__ == "__main__":
    main()
