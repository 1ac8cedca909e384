"""Verifiers run safely: exceptions and timeouts score 0 and are counted, never fatal.

These go through `score_completions` (the shared worker); tests/test_verifier_pool.py
covers `VerifierPool` and crashes."""

import threading
import time

import pytest

from rlscale.rlvr.rewards import score_completions
from rlscale.rlvr.tasks import ArithmeticTask, Example
from verifier_faults import ScriptedTask  # importable by the verifier worker (tests/ on sys.path)

EX = Example("p", None)


def test_normal_rewards_pass_through():
    scored = score_completions(ScriptedTask(), ["1", "0", "0.25", "1.0"], [EX] * 4)
    assert scored.rewards == [1.0, 0.0, 0.25, 1.0]
    assert (scored.errors, scored.timeouts, scored.crashes, scored.first_error) == (0, 0, 0, None)
    assert all(type(r) is float for r in scored.rewards)


def test_real_task_rewards():
    task = ArithmeticTask()
    examples = [Example("1+2=", 3), Example("2*5=", 10), Example("9+9=", 18)]
    scored = score_completions(task, ["3", "11", "18 "], examples)
    assert scored.rewards == [1.0, 0.0, 1.0]
    assert scored.errors == scored.timeouts == 0


def test_exceptions_score_zero_and_are_counted():
    scored = score_completions(ScriptedTask(), ["1", "raise", "0.5", "raise-other", "nan?"],
                               [EX] * 5)
    assert scored.rewards == [1.0, 0.0, 0.5, 0.0, 0.0]
    assert scored.errors == 3  # "nan?" makes float() raise ValueError
    assert scored.timeouts == 0
    assert scored.first_error is not None
    assert "RuntimeError" in scored.first_error and "boom in verifier" in scored.first_error


@pytest.mark.parametrize("kind", ["loop", "sleep", "stubborn"])
def test_timeouts_score_zero_and_are_counted(kind):
    start = time.perf_counter()
    scored = score_completions(ScriptedTask(), ["1", kind, "0.5"], [EX] * 3, timeout_s=0.3)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0  # the deadline, not the 10 s sleep (load-tolerant)
    assert scored.rewards == [1.0, 0.0, 0.5]
    assert scored.timeouts == 1 and scored.errors == 0
    assert "timed out" in scored.first_error


def test_non_finite_rewards_are_errors():
    scored = score_completions(ScriptedTask(), ["nan", "inf", "-inf", "1"], [EX] * 4)
    assert scored.rewards == [0.0, 0.0, 0.0, 1.0]
    assert scored.errors == 3 and scored.timeouts == 0
    assert "non-finite" in scored.first_error


def test_mixed_batch_counts_each_kind():
    start = time.perf_counter()
    scored = score_completions(ScriptedTask(), ["loop", "raise", "sleep", "1"], [EX] * 4,
                               timeout_s=0.3)
    assert time.perf_counter() - start < 5.0  # not the 10 s sleep: deadlines cut both (load-tolerant)
    assert scored.rewards == [0.0, 0.0, 0.0, 1.0]
    assert (scored.timeouts, scored.errors) == (2, 1)
    assert "timed out" in scored.first_error  # the first problem in batch order


def test_deadline_holds_off_the_main_thread():
    # SIGALRM only worked on the main thread; the async fleet scores from an orchestrator thread.
    box = {}
    thread = threading.Thread(target=lambda: box.update(
        scored=score_completions(ScriptedTask(), ["loop", "1"], [EX] * 2, timeout_s=0.2)))
    start = time.perf_counter()
    thread.start()
    thread.join(5)
    assert time.perf_counter() - start < 5.0
    assert box["scored"].rewards == [0.0, 1.0] and box["scored"].timeouts == 1


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError):
        score_completions(ScriptedTask(), ["1", "1"], [EX])
