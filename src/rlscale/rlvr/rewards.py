"""Run verifiers safely: an exception or a timeout scores 0 and is counted, never fatal."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .tasks import Example, Task


class VerifierTimeout(BaseException):
    """A BaseException, like KeyboardInterrupt: verifiers (math parsers especially) often
    wrap their work in `except Exception`, which would swallow the deadline and run on."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    # SIGALRM interrupts pure-Python loops and sleeps alike, at no per-call cost; it is only
    # available in the main thread, elsewhere the verifier runs without a deadline.
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise VerifierTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class ScoredBatch:
    rewards: list[float]
    errors: int = 0
    timeouts: int = 0
    first_error: str | None = None


def score_completions(task: Task, completions: Sequence[str], examples: Sequence[Example],
                      timeout_s: float = 2.0) -> ScoredBatch:
    out = ScoredBatch(rewards=[])
    for text, example in zip(completions, examples, strict=True):
        try:
            with _time_limit(timeout_s):
                reward = float(task.verify(text, example))
            if not math.isfinite(reward):  # one NaN reward would turn the whole update to NaN
                raise ValueError(f"non-finite reward {reward}")
        except VerifierTimeout:
            reward, out.timeouts = 0.0, out.timeouts + 1
            out.first_error = out.first_error or f"verifier timed out after {timeout_s}s"
        except Exception as exc:  # a broken verifier must not stop training
            reward, out.errors = 0.0, out.errors + 1
            out.first_error = out.first_error or f"verifier raised {type(exc).__name__}: {exc}"
        out.rewards.append(reward)
    return out
