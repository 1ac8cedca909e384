"""Policy versions: weight publishing and pulling, and staleness accounting.

Both loops share the same shape: a learner publishes weights with a monotonically
increasing version; actors pull the latest between units of work and stamp every sample
with the version that produced it, so the learner can measure how stale its data is.
"""

from __future__ import annotations

import collections
import copy
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


def alias_key(tensor) -> tuple:
    """What two tensors that are one (a tied embedding under two names) have in common."""
    return (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype)


def cpu_snapshot(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of `state_dict` with its tensors on the CPU: what a store holds, so weights a
    GPU learner publishes load into a network on any device (`load_state_dict` copies them).
    Tensors that share memory (a tied embedding) are copied once and stay shared."""
    copies: dict[tuple, Any] = {}
    out = {}
    for name, value in state_dict.items():
        if not hasattr(value, "detach"):
            out[name] = copy.deepcopy(value)
            continue
        key = alias_key(value)
        if key not in copies:
            copies[key] = value.detach().to("cpu", copy=True)
        out[name] = copies[key]
    return out


class WeightPublisher(Protocol):
    """Where a learner puts its weights and its actors find the newest: the one protocol of
    both loops. `publish` takes the caller's version (the learner counts versions, never
    the store); `latest` hands back (version, handle): a state dict in-process
    (`WeightStore`), one Ray object per version on a fleet (runtime.fleet.RayWeightPublisher:
    a packed `weight_sync.WeightPacket` where the fleet gives it a packer)."""

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
    """Finished work between producers (a fleet's orchestrator thread) and one consumer (the
    learner): each item carries the policy version that produced it (the oldest, for an item
    several versions made), so the consumer knows how stale what it takes is.

    Items leave in `order` (a key of the item; arrival order without one). `put` never
    blocks (the work is done by then); producers look at `len` to decide whether to go on.
    `take(n)` blocks until n items are there, or the producers `fail`; with `min_version` it
    first drops the items older than that and hands them to `on_stale`, so the consumer
    never trains on them and can count them. `lock` shares the producer's lock, so what the
    producer records and what the queue holds change together (a ledger always balances)."""

    def __init__(self, *, order: Callable[[T], Any] | None = None,
                 lock: threading.Condition | None = None) -> None:
        self._cv = lock if lock is not None else threading.Condition()
        self._order = order
        self._items: list[tuple[Any, int, int, T]] = []  # a heap: (key, arrival, version, item)
        self._arrivals = itertools.count()
        self._error: str | None = None

    def __len__(self) -> int:
        with self._cv:
            return len(self._items)

    def put(self, item: T, version: int) -> None:
        with self._cv:
            arrival = next(self._arrivals)
            key = self._order(item) if self._order is not None else arrival
            heapq.heappush(self._items, (key, arrival, version, item))
            self._cv.notify_all()

    def take(self, n: int, timeout: float | None = None, *, min_version: int | None = None,
             on_stale: Callable[[list[tuple[int, T]]], None] | None = None,
             ) -> list[tuple[int, T]]:
        """The first n (version, item) pairs in order; QueueClosed if the producers failed
        first, TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                if self._error is not None:
                    raise QueueClosed(self._error)
                if min_version is not None:
                    self._drop_older(min_version, on_stale)
                if len(self._items) >= n:
                    return [self._pop() for _ in range(n)]
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{len(self._items)} of {n} items after {timeout} s")
                self._cv.wait(left)

    def _pop(self) -> tuple[int, T]:
        _, _, version, item = heapq.heappop(self._items)
        return version, item

    def _drop_older(self, min_version: int,
                    on_stale: Callable[[list[tuple[int, T]]], None] | None) -> None:
        stale = [(v, item) for _, _, v, item in self._items if v < min_version]
        if stale:
            self._items = [entry for entry in self._items if entry[2] >= min_version]
            heapq.heapify(self._items)
            if on_stale is not None:
                on_stale(stale)

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
