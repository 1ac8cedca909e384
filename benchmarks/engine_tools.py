"""Tool waits in the engine: parked slots vs a static batch that waits, at simulated tool
latencies of 0, 10 and 100 ms.

    .venv/bin/python benchmarks/engine_tools.py [--requests 64] [--slots 16] [--latencies 0,10,100]
                                                [--models tiny,small] [--repeats 2]

Every request generates exactly `--tokens` sampled tokens (EOS ignored) and calls a tool
after every `--every` sampled tokens (at most `--calls`); each call's result is 6 tokens and
comes back after the latency, from another thread as a real tool's would (the engine's
`ToolTurns` protocol; the tool itself does nothing, so only the wait is measured).

- parked: the continuous-batching engine with `--slots` slots and every request queued: a
  request that calls leaves its slot to the queue while it waits, and resumes at the front.
- static: batches of `--slots` requests, each run to its end before the next starts, and
  when a row calls, the whole batch waits for the calls in flight before anyone decodes again
  (turn-based static batching, as a sampler without continuous batching does it). Same
  engine and kernels, so the difference is the scheduling.

Prints sampled tokens/s (tool tokens not counted) and each latency's rate as a share of the
same runner's no-tool rate, for each model; interleaved repeats, median reported.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
from engine import build_model, mixed_length_workload  # noqa: E402  (benchmarks/ on the path)

from rlscale.rlvr.model import build_char_tokenizer
from rlscale.rlvr.rollout.engine import ContinuousBatchingEngine
from rlscale.rlvr.rollout.types import EngineSampling, GenerationRequest

RESULT = [5, 6, 7, 8, 9, 10]  # a result's token ids (any ids: the model just reads them)


class SimulatedTool:
    """A call after every `every` sampled tokens, at most `calls`; its result after
    `latency_s`. With `barrier`, results are held until no row is decoding (the static
    batch waits for every call in flight)."""

    def __init__(self, every: int, calls: int, latency_s: float, barrier: bool = False):
        self.every, self.calls, self.latency_s, self.barrier = every, calls, latency_s, barrier
        self.engine: ContinuousBatchingEngine | None = None
        self._cv = threading.Condition()
        self._done: list[tuple[int, list[int]]] = []
        self.in_flight = 0

    def call_in(self, token_ids: list[int], calls_made: int):
        sampled = len(token_ids) - calls_made * len(RESULT)
        return "call" if calls_made < self.calls and sampled == self.every * (calls_made + 1) \
            else None

    def start(self, request_id: int, call) -> None:
        with self._cv:
            self.in_flight += 1

        def finish():
            with self._cv:
                self._done.append((request_id, list(RESULT)))
                self._cv.notify_all()

        threading.Timer(self.latency_s, finish).start() if self.latency_s else finish()

    def results(self, timeout: float) -> list[tuple[int, list[int]]]:
        with self._cv:
            if self.barrier:  # the batch resumes only when every call in flight is back
                decoding = self.engine is not None and self.engine.num_running > 0
                ready = not decoding and len(self._done) == self.in_flight
                if not ready:
                    if not decoding:
                        self._cv.wait(timeout)
                    return []
            elif not self._done and timeout > 0:
                self._cv.wait(timeout)
            done, self._done = self._done, []
            self.in_flight -= len(done)
            return done


def run(model, tokenizer, prompts: list[str], args, latency_s: float, static: bool) -> float:
    """Sampled tokens per second of one runner."""
    sampling = EngineSampling(temperature=1.0, ignore_eos=True)
    ids = [tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    waves = [ids[i:i + args.slots] for i in range(0, len(ids), args.slots)] if static else [ids]
    start, sampled = time.perf_counter(), 0
    for w, wave in enumerate(waves):
        tool = SimulatedTool(args.every, args.calls, latency_s, barrier=static)
        engine = ContinuousBatchingEngine(model, sampling, slots=args.slots,
                                          eos_token_id=tokenizer.eos_token_id,
                                          pad_token_id=tokenizer.pad_token_id, seed=w,
                                          tools=tool if args.calls else None)
        tool.engine = engine
        for i, prompt in enumerate(wave):
            engine.add_request(GenerationRequest(i, prompt, args.tokens + args.calls * len(RESULT)))
        for c in engine.run():
            sampled += len(c) - sum(c.tool_mask)
    return sampled / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=96, help="sampled tokens per request")
    parser.add_argument("--every", type=int, default=32, help="sampled tokens between calls")
    parser.add_argument("--calls", type=int, default=2, help="calls per request at most")
    parser.add_argument("--latencies", default="0,10,100", help="tool latency, ms")
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = build_char_tokenizer()
    prompts = [p for p, _ in mixed_length_workload(args.requests)]
    latencies = [float(x) for x in args.latencies.split(",")]
    print(f"{args.requests} requests x {args.tokens} sampled tokens, a call every "
          f"{args.every} (at most {args.calls}), {args.slots} slots, {args.threads} thread(s)")
    print("| model | tool latency | parked tok/s | static tok/s | parked / static | "
          "parked vs its no-tool rate | static vs its no-tool rate |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in args.models.split(","):
        model = build_model(size)
        with torch.no_grad():
            base = {kind: statistics.median(
                run(model, tokenizer, prompts, argparse.Namespace(**{**vars(args), "calls": 0}),
                    0.0, kind == "static") for _ in range(args.repeats))
                for kind in ("parked", "static")}
            print(f"| {size} | no tools | {base['parked']:.0f} | {base['static']:.0f} | "
                  f"{base['parked'] / base['static']:.2f}x | 100% | 100% |")
            for ms in latencies:
                rates = {"parked": [], "static": []}
                for _ in range(args.repeats):  # interleaved
                    for kind in rates:
                        rates[kind].append(run(model, tokenizer, prompts, args, ms / 1000,
                                               kind == "static"))
                p, s = (statistics.median(rates[k]) for k in ("parked", "static"))
                print(f"| {size} | {ms:.0f} ms | {p:.0f} | {s:.0f} | {p / s:.2f}x | "
                      f"{p / base['parked']:.0%} | {s / base['static']:.0%} |", flush=True)


if __name__ == "__main__":
    main()
