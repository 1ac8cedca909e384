"""Policy versions: weight publishing and pulling, and staleness accounting.

Both loops share the same shape: a learner publishes weights with a monotonically
increasing version; actors pull the latest between units of work and stamp every sample
with the version that produced it, so the learner can measure how stale its data is.
"""

from __future__ import annotations

import collections
import copy
import threading
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


def cpu_snapshot(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of `state_dict` with its tensors on the CPU: what a store holds, so weights a
    GPU learner publishes load into a network on any device (`load_state_dict` copies them)."""
    return {k: v.detach().to("cpu", copy=True) if hasattr(v, "detach") else copy.deepcopy(v)
            for k, v in state_dict.items()}


class WeightPublisher(Protocol):
    """Where a learner puts its weights and its actors find the newest: the one protocol of
    both loops. `publish` takes the caller's version (the learner counts versions, never
    the store); `latest` hands back (version, handle): a state dict in-process
    (`WeightStore`), one Ray object per version on a fleet (runtime.fleet.RayWeightPublisher)."""

    def publish(self, state_dict: dict[str, Any], version: int) -> None: ...

    def latest(self) -> tuple[int, Any]: ...


class WeightStore:
    """The in-process `WeightPublisher`: CPU copies, read by actors in the same process."""

    def __init__(self, state_dict: dict[str, Any] | None = None, version: int = 0) -> None:
        self._lock = threading.Lock()
        self._version = version
        self._state = cpu_snapshot(state_dict) if state_dict is not None else None

    @property
    def version(self) -> int:
        return self._version

    def publish(self, state_dict: dict[str, Any], version: int) -> None:
        snapshot = cpu_snapshot(state_dict)
        with self._lock:
            self._version, self._state = version, snapshot

    def latest(self) -> tuple[int, dict[str, Any] | None]:
        with self._lock:
            return self._version, self._state


class QueueClosed(RuntimeError):
    """The producers of a `VersionedQueue` stopped; the message says why."""


class VersionedQueue(Generic[T]):
    """A FIFO between producers (e.g. a fleet's orchestrator thread) and one consumer (the
    learner): each item carries the policy version that produced it (the oldest, for an item
    several versions made), so the consumer knows how stale what it takes is.

    `put` never blocks (the work is done by then); producers look at `len` to decide whether
    to go on. `take(n)` blocks until n items are there, or the producers `fail`."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._items: collections.deque[tuple[int, T]] = collections.deque()
        self._error: str | None = None

    def __len__(self) -> int:
        with self._cv:
            return len(self._items)

    def put(self, item: T, version: int) -> None:
        with self._cv:
            self._items.append((version, item))
            self._cv.notify_all()

    def take(self, n: int, timeout: float | None = None) -> list[tuple[int, T]]:
        """The n oldest (version, item) pairs; QueueClosed if the producers failed first,
        TimeoutError after `timeout` seconds."""
        with self._cv:
            ok = self._cv.wait_for(lambda: self._error is not None or len(self._items) >= n,
                                   timeout)
            if self._error is not None:
                raise QueueClosed(self._error)
            if not ok:
                raise TimeoutError(f"{len(self._items)} of {n} items after {timeout} s")
            return [self._items.popleft() for _ in range(n)]

    def fail(self, reason: str) -> None:
        """Wake the consumer with an error: nothing more will come."""
        with self._cv:
            self._error = reason
            self._cv.notify_all()


def staleness(current_version: int, sample_versions: Iterable[int]) -> dict[str, float]:
    """Version-lag summary of a batch: how many publishes behind each sample was."""
    lags = [current_version - v for v in sample_versions]
    if not lags:
        return {}
    hist = collections.Counter(lags)
    out = {
        "staleness/lag_mean": sum(lags) / len(lags),
        "staleness/lag_max": float(max(lags)),
    }
    for lag in sorted(hist)[:4]:
        out[f"staleness/share_lag_{lag}"] = hist[lag] / len(lags)
    return out
