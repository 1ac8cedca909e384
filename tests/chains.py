"""Hand-made `long_arithmetic` examples for the tests: an Example from a chain's prompt."""

import re

from rlscale.rlvr.tasks import Example


def chain(prompt: str) -> Example:
    """An example from a prompt like '47+385-96=' (its answer and meta as the task makes)."""
    first, rest = re.fullmatch(r"([0-9]+)(.*)=", prompt).groups()
    ops = [(s, int(t)) for s, t in re.findall(r"([+-])([0-9]+)", rest)]
    total = int(first) + sum(t if s == "+" else -t for s, t in ops)
    return Example(prompt, total, {"first": int(first), "ops": ops, "terms": len(ops) + 1})
