"""Verifiers run in worker processes: every fault scores 0 and is counted by cause, the pool
goes on, results keep their order, and no worker process outlives its pool."""

import os
import pickle
import random
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

from rlscale.rlvr.config import TaskConfig
from rlscale.rlvr.rewards import VerifierPool
from rlscale.rlvr.tasks import ArithmeticTask, CountdownTask, Example, examples
from rlscale.runtime.workpool import DEFAULT_MEMORY_MB, Crash, Error, Ok, Timeout, WorkPool
from verifier_faults import ScriptedTask, misbehave

EX = Example("p", None)
TIMEOUT_S = 0.5


def alive(pid: int) -> bool:
    """Running (a reaped process has no /proc entry; a zombie is not running)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(ScriptedTask(), workers=1, timeout_s=TIMEOUT_S) as verifiers:
        yield verifiers
    assert not any(alive(pid) for pid in verifiers.pids)


@pytest.mark.parametrize("command, counted, message", [
    ("sleep", "timeouts", "timed out after 0.5s"),
    ("loop", "timeouts", "timed out"),
    ("stubborn", "timeouts", "timed out"),
    ("segfault", "crashes", "SIGSEGV"),
    ("exit", "crashes", "exit status 3"),
    ("kill-self", "crashes", "SIGKILL"),
    ("alloc", "errors", "MemoryError"),
    ("raise", "errors", "RuntimeError: boom in verifier"),
    ("nan", "errors", "non-finite reward nan"),
    ("inf", "errors", "non-finite"),
])
def test_each_fault_scores_zero_counted_by_cause(pool, command, counted, message):
    before = pool.pids
    scored = pool.score(["1", command, "0.5"], [EX] * 3)
    assert scored.rewards == [1.0, 0.0, 0.5]
    counts = {"errors": scored.errors, "timeouts": scored.timeouts, "crashes": scored.crashes}
    assert counts == {kind: int(kind == counted) for kind in counts}
    assert message in scored.first_error and "\n" not in scored.first_error
    if counted == "errors":  # the worker survives an exception, MemoryError included
        assert pool.pids == before
    else:  # a killed or dead worker is reaped and replaced
        assert pool.pids != before and not alive(before[0]) and alive(pool.pids[0])
    # and the pool scores the next batch correctly
    assert pool.score(["0.25", "1"], [EX] * 2).rewards == [0.25, 1.0]


def test_timeout_kills_what_the_call_started(pool, tmp_path):
    pid_file = tmp_path / "helper.pid"
    scored = pool.score([f"spawn-and-sleep:{pid_file}"], [EX])
    assert scored.timeouts == 1
    helper = int(pid_file.read_text())
    deadline = time.monotonic() + 2.0  # killed with the worker's process group; init reaps it
    while alive(helper) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(helper)


def test_mixed_faults_in_one_batch(pool):
    commands = ["1", "sleep", "segfault", "alloc", "raise", "nan", "exit", "0.5"]
    start = time.perf_counter()
    scored = pool.score(commands, [EX] * len(commands))
    assert time.perf_counter() - start < TIMEOUT_S + 3.0  # one deadline, three respawns
    assert scored.rewards == [1.0, 0, 0, 0, 0, 0, 0, 0.5]
    assert (scored.timeouts, scored.crashes, scored.errors) == (1, 2, 3)
    assert "timed out" in scored.first_error  # the first problem in batch order


@pytest.mark.parametrize("task", [ArithmeticTask(), CountdownTask()], ids=lambda t: t.name)
def test_order_and_values_match_in_process_verify(task):
    rng = random.Random(0)
    items = examples(task, "train", 0, 150)
    completions = [task.demonstration(ex, rng) if i % 3 else task.corrupt(ex, rng)
                   for i, ex in enumerate(items)]
    completions[7] = "not an answer (("
    expected = [task.verify(c, ex) for c, ex in zip(completions, items, strict=True)]
    assert 0 < sum(expected) < len(expected)
    with VerifierPool(task, workers=2, timeout_s=5.0) as verifiers:  # several chunks per worker
        scored = verifiers.score(completions, items)
    assert scored.rewards == expected
    assert (scored.errors, scored.timeouts, scored.crashes) == (0, 0, 0)


def test_concurrent_scores_from_threads(pool):
    results: dict[int, list[float]] = {}

    def score(k: int) -> None:
        values = [str(k + i / 100) for i in range(40)]
        results[k] = pool.score(values, [EX] * 40).rewards

    threads = [threading.Thread(target=score, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {k: [k + i / 100 for i in range(40)] for k in range(4)}


def test_workers_are_separate_processes_and_close_reaps_them():
    with VerifierPool(ScriptedTask(), workers=2) as verifiers:
        pids = verifiers.pids
        assert len(set(pids)) == 2 and os.getpid() not in pids
        worker_pids = {int(r) for r in verifiers.score(["pid"] * 40, [EX] * 40).rewards}
        assert worker_pids == set(pids)  # both took a share
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        verifiers.score(["1"], [EX])


def test_length_mismatch_and_unpicklable_task():
    with VerifierPool(ScriptedTask()) as verifiers, pytest.raises(ValueError):
        verifiers.score(["1", "1"], [EX])

    class LocalTask(ScriptedTask):  # defined in a function: a worker could not import it
        pass

    with pytest.raises(TypeError, match="picklable"):
        VerifierPool(LocalTask())


def test_config_builds_the_pool():
    config = TaskConfig(verifier_workers=2, verifier_timeout_s=1.5, verifier_memory_mb=1024)
    assert TaskConfig().verifier_memory_mb == DEFAULT_MEMORY_MB
    with VerifierPool.from_config(ScriptedTask(), config) as verifiers:
        assert len(verifiers.pids) == 2 and verifiers.timeout_s == 1.5
        assert verifiers._pool.memory_mb == 1024
        assert verifiers.score(["1"], [EX]).rewards == [1.0]


def test_workpool_outcomes_and_unimportable_callable():
    ghost = types.ModuleType("ghost_module_only_in_parent")
    exec("def double(x):\n    return 2 * x\n", ghost.__dict__)
    sys.modules[ghost.__name__] = ghost
    try:
        with WorkPool(1, timeout_s=TIMEOUT_S) as pool:
            outcomes = pool.map(misbehave, [("2",), ("sleep",), ("segfault",), ("raise",)])
            assert outcomes[0] == Ok(2.0) and outcomes[1] == Timeout(TIMEOUT_S)
            assert outcomes[2] == Crash(-11) and outcomes[2].describe() == "worker died (SIGSEGV)"
            assert outcomes[3] == Error("RuntimeError: boom in verifier")
            # the callable pickles by reference, which the worker cannot resolve: every call
            # of the chunk is an error, and the worker carries on
            outcomes = pool.map(ghost.double, [(1,), (2,)])
            assert all(isinstance(o, Error) and "ghost_module" in o.message for o in outcomes)
            assert pool.map(misbehave, [("3",)], timeout_s=None) == [Ok(3.0)]
            assert pool.map(misbehave, []) == []
            with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
                pool.map(lambda x: x, [(1,)])
    finally:
        del sys.modules[ghost.__name__]


ORPHAN_SCRIPT = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, {tests!r})
    from rlscale.rlvr.rewards import VerifierPool
    from verifier_faults import ScriptedTask
    from rlscale.rlvr.tasks import Example
    def run():
        verifiers = VerifierPool(ScriptedTask(), workers=2, timeout_s=60.0)
        print(*verifiers.pids, flush=True)
        if sys.argv[1] != "exit":  # parent killed while its workers are stuck in verifiers
            verifiers.score(["loop", "loop"], [Example("p", None)] * 2)
    if sys.argv[1] == "busy-thread":  # no PR_SET_PDEATHSIG: the worker's watchdog acts
        threading.Thread(target=run).start()
    else:
        run()
    # "exit": leave without close(); the pool's finalizer stops the workers at exit
""")


@pytest.mark.parametrize("how", ["exit", "busy", "busy-thread"])
def test_no_worker_outlives_its_parent(tmp_path, how):
    script = tmp_path / "parent.py"
    script.write_text(ORPHAN_SCRIPT.format(tests=str(Path(__file__).parent)))
    parent = subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2
    if how != "exit":
        time.sleep(0.3)
        assert all(alive(pid) for pid in pids)
        parent.kill()
    parent.wait(30)
    deadline = time.monotonic() + 5.0
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


def test_overhead_of_256_trivial_calls():
    """Scoring the quickstart batch must cost well under 10% of a 1-2 s step; the figure
    itself is reported by benchmarks/verifier_pool.py (this bound is loose for loaded CI)."""
    task = ArithmeticTask()
    items = examples(task, "train", 0, 256, unique=False)
    completions = [str(ex.answer) for ex in items]
    with VerifierPool(task, workers=1) as verifiers:
        verifiers.score(completions, items)  # the worker imports the task module once
        times = []
        for _ in range(5):
            start = time.perf_counter()
            scored = verifiers.score(completions, items)
            times.append(time.perf_counter() - start)
    assert scored.rewards == [1.0] * 256
    assert sorted(times)[2] < 0.1


def test_evaluate_scores_with_the_given_pool(monkeypatch):
    import rlscale.rlvr.evaluate as ev
    from rlscale.rlvr.model import build_tiny_model

    model, tokenizer = build_tiny_model("tiny", seed=0)
    task = ArithmeticTask()

    def right_answers(tokenizer_, rollout):
        answers = []
        for ids in rollout.prompt_ids:  # "12+34=" or "12*3="
            a, op, b = tokenizer.decode(ids)[:-1].replace("*", " * ").replace("+", " + ").split()
            answers.append(str(int(a) + int(b) if op == "+" else int(a) * int(b)))
        return answers

    def shared_pool_used(*args, **kwargs):
        raise AssertionError("evaluate used the shared pool instead of the one given")

    monkeypatch.setattr(ev, "decode_completions", right_answers)
    monkeypatch.setattr(ev, "score_completions", shared_pool_used)
    with VerifierPool(task, workers=1) as verifiers:
        result = ev.evaluate(model, tokenizer, task, prompts=6, samples=2, ks=(1, 2),
                             max_new_tokens=2, batch_size=5, verifiers=verifiers)
    assert result.per_prompt_correct == [2] * 6 and result.pass_at[1] == 1.0
