"""Tool calls inside rollouts: the `ToolTurns` an engine drives (rollout/types.py), over the
`ToolRunner` that executes calls (tools.py).

The engine asks after every sampled token whether the request just closed a call
(`call_in`): the last few tokens are decoded and compared with the close tags, and only on a
match is the whole generated text decoded and parsed (`tools.parse_call`). A call starts in
the background (`start`): one thread per call in flight, each running it through the
runner's worker processes under its tool's deadline, so a slow tool holds no decode step.
Its result comes back as token ids (`results`): the markup's result tags (or the chat
template's tool message) around the tool's text (or its one-line failure reason); the text is
encoded as plain text, so a special token's string in it is not that token.

Per run, the figures the loop logs (`ToolTurnStats`): calls and their causes come from the
runner; the seconds each call waited between start and delivery are summed here.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .tools import (
    ToolCall,
    ToolRunner,
    ToolsConfig,
    close_tags,
    encode_result_turn,
    parse_call,
    result_turn,
)


@dataclass
class ToolTurnStats:
    calls: int = 0
    wait_s: float = 0.0          # start to result, summed over calls
    skipped_over_limit: int = 0  # calls closed past max_tool_calls (not run)


class RunnerToolTurns:
    """`ToolTurns` for one engine: calls parsed from its requests' text, run by `runner`.
    Built by `from_config`, it owns its runner (`close` stops both)."""

    @classmethod
    def from_config(cls, config: ToolsConfig, tokenizer) -> RunnerToolTurns:
        return cls(ToolRunner.from_config(config), config, tokenizer)

    def __init__(self, runner: ToolRunner, config: ToolsConfig, tokenizer) -> None:
        self.runner, self.config, self.tokenizer = runner, config, tokenizer
        self.reproducible = config.reproducible
        self.names = tuple(runner.tools)
        self.closing = tuple(close_tags(config.markup, self.names))
        # Enough tokens to hold a close tag (at worst one token per character).
        self.tail = max(len(tag) for tag in self.closing)
        self.stats = ToolTurnStats()
        try:  # a chat template that cannot write a tool message: one error now, not per call
            result_turn("", config.markup, tokenizer, self.names[0])
        except BaseException:
            runner.close()
            raise
        self._cv = threading.Condition()
        self._done: list[tuple[int, list[int]]] = []
        self._pool = ThreadPoolExecutor(max_workers=max(config.workers, 1) * 4,
                                        thread_name_prefix="rlscale-tool")

    # -- ToolTurns ------------------------------------------------------------------------
    def call_in(self, token_ids: list[int], calls_made: int) -> ToolCall | None:
        tail = self.tokenizer.decode(token_ids[-self.tail:], skip_special_tokens=False)
        if not tail.rstrip().endswith(self.closing):
            return None
        call = parse_call(self.tokenizer.decode(token_ids, skip_special_tokens=False),
                          self.config.markup, self.names)
        if call is None:
            return None
        if calls_made >= self.config.max_tool_calls:
            with self._cv:
                self.stats.skipped_over_limit += 1
            return None
        return call

    def start(self, request_id: int, call: ToolCall) -> None:
        self._pool.submit(self._run, request_id, call, time.monotonic())

    def results(self, timeout: float) -> list[tuple[int, list[int]]]:
        with self._cv:
            if not self._done and timeout > 0:
                self._cv.wait(timeout)
            done, self._done = self._done, []
            return done

    # -- the calls ------------------------------------------------------------------------
    def _run(self, request_id: int, call: ToolCall, started: float) -> None:
        try:
            (result,) = self.runner.run([call])
            text = result.text
        except Exception as exc:  # the runner itself failed: the model reads why
            text = f"tool error: {type(exc).__name__}"
        ids = encode_result_turn(self.tokenizer, result_turn(
            text, self.config.markup, self.tokenizer, call.name or ""))
        with self._cv:
            self._done.append((request_id, ids))
            self.stats.calls += 1
            self.stats.wait_s += time.monotonic() - started
            self._cv.notify_all()

    def metrics(self) -> dict[str, float]:
        """The run's tool figures so far: the runner's calls by cause, the wait."""
        with self._cv:
            stats = self.stats
            out = {"tools/wait_s_mean": stats.wait_s / max(stats.calls, 1),
                   "tools/over_limit": float(stats.skipped_over_limit)}
        return {**self.runner.stats.as_metrics(), **out}

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.runner.close()
