"""What a model does on multi-term chains, read for emergence (docs/emergence.md): by chain
length, pass@1, the share of completions with any worked line, the lines that work the
prompt's own chain and the completion's characters; and whether a model can *use* worked lines it
is handed (the answer it writes after the chain's right lines, greedy), the skill a strategy
of writing lines needs before RL can reward it; and how a model's checks treat its own slips
(`checking`: the share of its checked wrong steps its checks flag, and of its slips a redo
fixes).

For `long_arithmetic`; the counters are its own (`behaviour`, `chained_lines`).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .evaluate import EvalResult
from .tasks import Example
from .tasks.long_arithmetic import ANSWER_CLOSE, ANSWER_OPEN, LongArithmeticTask, count_behaviour

# What `by_terms` reports per chain length: means per completion.
FIGURES = ("pass@1", "intermediate", "chained_lines", "characters")


def by_terms(task: LongArithmeticTask, result: EvalResult) -> dict[int, dict[str, float]]:
    """Per chain length (terms): each of FIGURES over the result's completions (every sample
    of every prompt; `pass@1` is the share of right ones)."""
    samples = result.samples
    rows: dict[int, list[tuple[float, ...]]] = defaultdict(list)
    for index, text in enumerate(result.texts):
        example = result.examples[index // samples]
        counters = task.behaviour(text, example)
        rows[example.meta["terms"]].append((task.verify(text, example), counters["intermediate"],
                                            counters["chained_lines"], len(text)))
    return {terms: {name: sum(row[i] for row in items) / len(items)
                    for i, name in enumerate(FIGURES)}
            for terms, items in sorted(rows.items())}


def over_terms(table: dict[int, dict[str, float]], lo: int, hi: int) -> dict[str, float]:
    """FIGURES averaged over the chain lengths lo..hi of a `by_terms` table (each length
    weighted equally)."""
    chosen = [row for terms, row in table.items() if lo <= terms <= hi]
    if not chosen:
        raise ValueError(f"no completions of chains of {lo}-{hi} terms")
    return {name: sum(row[name] for row in chosen) / len(chosen) for name in FIGURES}


@dataclass(frozen=True)
class Checking:
    """How a model's checks treat its own steps, summed over completions (the counters of
    `long_arithmetic`'s grammar)."""

    completions: int
    steps: int           # worked lines of one operation
    checks: int          # check clauses
    wrong_steps: int     # worked lines whose arithmetic is wrong (checked or not)
    true_alarms: int     # checks that said "no" to a wrong step
    missed_slips: int    # checks that said "ok" to a wrong step
    false_alarms: int    # checks that said "no" to a right step
    corrected: int       # wrong steps flagged and then written again right

    @property
    def alarm_rate(self) -> float:
        """The true-alarm rate: the share of checked wrong steps the check flags (0 when no
        wrong step was checked)."""
        checked_wrong = self.true_alarms + self.missed_slips
        return self.true_alarms / checked_wrong if checked_wrong else 0.0

    @property
    def false_alarm_rate(self) -> float:
        """The share of checked right steps the check flags."""
        checked_right = self.checks - self.true_alarms - self.missed_slips
        return self.false_alarms / checked_right if checked_right else 0.0

    @property
    def corrected_share(self) -> float:
        """The share of all wrong steps (checked or not) that a redo fixed."""
        return self.corrected / self.wrong_steps if self.wrong_steps else 0.0

    @property
    def checked_share(self) -> float:
        """Check clauses per one-operation step."""
        return self.checks / self.steps if self.steps else 0.0

    @property
    def wrong_step_share(self) -> float:
        """Wrong worked lines per one-operation step."""
        return self.wrong_steps / self.steps if self.steps else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**vars(self), "alarm_rate": self.alarm_rate,
                "false_alarm_rate": self.false_alarm_rate,
                "corrected_share": self.corrected_share,
                "checked_share": self.checked_share, "wrong_step_share": self.wrong_step_share}


def checking(result: EvalResult) -> Checking:
    """The checking counters over every completion of `result` (a `long_arithmetic` eval)."""
    totals = dict.fromkeys(("steps", "checks", "wrong_steps", "true_alarms", "missed_slips",
                            "false_alarms", "corrected"), 0)
    for text in result.texts:
        counters = count_behaviour(text)
        for name in totals:
            totals[name] += getattr(counters, name)
    return Checking(len(result.texts), **totals)


@dataclass(frozen=True)
class LineUse:
    """Greedy answers of a model handed the chain's worked lines, against the prompt alone."""

    prompts: int
    alone: float        # right answers after the prompt alone
    after_lines: float  # right answers after the prompt and the chain's right lines
    copies_last: float  # answers after the lines that equal the last line's result

    def as_dict(self) -> dict[str, float]:
        return {"prompts": self.prompts, "alone": self.alone, "after_lines": self.after_lines,
                "copies_last": self.copies_last}


@torch.no_grad()
def line_use(model, tokenizer, task: LongArithmeticTask, examples: Sequence[Example],
             max_new_tokens: int = 16) -> LineUse:
    """Whether a model can use worked lines it did not write: its greedy answer to each
    prompt alone, and after the prompt with the chain's right lines (one operation a line,
    no slips) and the answer tag's opening."""
    model.eval()
    exact = LongArithmeticTask(**{**vars(task), "step_error": 0.0, "tool_share": 0.0})
    alone = after = copies = 0
    for example in examples:
        lines = exact.demonstrate(example, "plain", random.Random(0)).split("\n")[:-1]
        last = lines[-1].rsplit("=", 1)[1] if lines else str(example.answer)
        alone += _greedy_answer(model, tokenizer, example.prompt + ANSWER_OPEN,
                                max_new_tokens) == str(example.answer)
        given = _greedy_answer(model, tokenizer,
                               example.prompt + "\n".join(lines) + "\n" + ANSWER_OPEN,
                               max_new_tokens)
        after += given == str(example.answer)
        copies += given == last
    n = max(len(examples), 1)
    return LineUse(len(examples), alone / n, after / n, copies / n)


def _greedy_answer(model, tokenizer, text: str, max_new_tokens: int) -> str:
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]],
                       device=next(model.parameters()).device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=tokenizer.pad_token_id)
    written = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    return written.split(ANSWER_CLOSE, 1)[0]
