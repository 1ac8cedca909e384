"""What scoring in worker processes costs: the quickstart batch (256 arithmetic completions)
in-process versus through a `VerifierPool`, plus a worker's start and a timeout's price.

    .venv/bin/python benchmarks/verifier_pool.py [--batch 256] [--repeats 50]

Prints milliseconds per batch (median and 90th percentile over `--repeats` batches).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable

from rlscale.rlvr.rewards import VerifierPool
from rlscale.rlvr.tasks import ArithmeticTask, examples


def timed_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    fn()  # warm: the worker imports the task's module on its first chunk
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    task = ArithmeticTask()
    rng = random.Random(0)
    items = examples(task, "train", 0, args.batch, unique=False)
    completions = [task.demonstration(ex, rng) if i % 2 else task.corrupt(ex, rng)
                   for i, ex in enumerate(items)]

    def in_process() -> list[float]:
        rewards = [float(task.verify(c, ex)) for c, ex in zip(completions, items, strict=True)]
        return [r if math.isfinite(r) else 0.0 for r in rewards]

    print(f"{args.batch} arithmetic completions per batch, {args.repeats} batches")
    print(f"{'scoring':<24} {'median ms':>10} {'p90 ms':>8}")
    median, p90 = timed_ms(in_process, args.repeats)
    print(f"{'in-process':<24} {median:>10.2f} {p90:>8.2f}")
    for workers in (1, 2):
        start = time.perf_counter()
        with VerifierPool(task, workers=workers, timeout_s=2.0) as verifiers:
            started_ms = 1000 * (time.perf_counter() - start)
            assert verifiers.score(completions, items).rewards == in_process()
            median, p90 = timed_ms(lambda v=verifiers: v.score(completions, items), args.repeats)
        print(f"{f'VerifierPool workers={workers}':<24} {median:>10.2f} {p90:>8.2f}"
              f"   (pool start {started_ms:.0f} ms)")

    # A timeout costs its deadline plus killing and replacing the worker.
    from verifier_faults import ScriptedTask  # noqa: PLC0415 - tests/ helper, only here

    with VerifierPool(ScriptedTask(), workers=1, timeout_s=0.2) as verifiers:
        verifiers.score(["1"], [items[0]])
        start = time.perf_counter()
        verifiers.score(["sleep", "1"], [items[0]] * 2)
        print(f"one 0.2 s timeout then one call: {1000 * (time.perf_counter() - start):.0f} ms "
              f"(replacement start included)")


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    main()
