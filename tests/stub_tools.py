"""A stand-in tool for the engines' tests (tests/test_engine_tools.py, the vLLM engine's): calls
closed at fixed token counts, results from another thread after a set latency."""

from __future__ import annotations

import threading


class EveryNthToken:
    """A stand-in tool: a call is closed by the request's `after`-th generated token; the
    result (`result`) comes back after `latency_s` (or the request's own in `latency_of`), from
    another thread as a real tool's would. At most `max_calls` per request."""

    def __init__(self, result: list[int], after: int = 3, latency_s: float = 0.0,
                 max_calls: int = 1, reproducible: bool = False,
                 latency_of: dict[int, float] | None = None) -> None:
        self.result, self.after, self.latency_s, self.max_calls = result, after, latency_s, max_calls
        self.reproducible = reproducible
        self.latency_of = latency_of or {}  # request id -> its calls' latency (else latency_s)
        self.calls: dict[int, int] = {}
        self._done: list[tuple[int, list[int]]] = []
        self._cv = threading.Condition()

    def call_in(self, token_ids: list[int], made: int) -> str | None:
        sampled = len(token_ids) - made * len(self.result)
        if made < self.max_calls and sampled == self.after * (made + 1):
            return f"call {made}"
        return None

    def start(self, request_id: int, call: str) -> None:
        self.calls[request_id] = self.calls.get(request_id, 0) + 1

        def finish():
            with self._cv:
                self._done.append((request_id, list(self.result)))
                self._cv.notify_all()

        threading.Timer(self.latency_of.get(request_id, self.latency_s), finish).start()

    def results(self, timeout: float) -> list[tuple[int, list[int]]]:
        with self._cv:
            if not self._done:
                self._cv.wait(timeout)
            done, self._done = self._done, []
            return done
