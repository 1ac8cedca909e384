"""The orchestrator skeleton both fleets share: a thread beside the learner that keeps a
fleet of Ray actors busy and hands their finished work to the learner.

Knows nothing of language models or games. What it owns, once for both loops:
- the `ActorFleet` (one call in flight per actor; a dead actor restarted, the work it held
  handed back to `_on_death`);
- the `RayWeightPublisher` (the learner's `publish`; `latest` for the dispatcher), with
  the `SyncClock` that times each version from the learner's call to a worker serving it;
- the thread: prepare work, dispatch a call to every idle actor, collect what came back,
  and sleep on the lock when there is nothing to do;
- the `VersionedQueue` of finished work, sharing the orchestrator's lock, so what a
  specialisation records and what the queue holds change together;
- failure: an exception in the thread closes the queue, and the learner's next `take`
  raises a one-line `FleetError`;
- `start` (every actor built and answering before the thread runs) and `close`.

A specialisation (`rlvr.fleet.FleetRollouts`, `zero.actors.FleetSelfPlay`) says what an
actor is (`_make_worker`), what one call asks of it (`_dispatch`), what to do with its report
(`_on_report`) and with its death (`_on_death`), and what a checkpoint keeps
(`checkpoint_state`).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .fleet import ActorDied, ActorFleet, FleetError, RayWeightPublisher, import_ray
from .versions import QueueClosed, VersionedQueue
from .weight_sync import SyncClock, WeightPacker

T = TypeVar("T")  # one unit of finished work, as the learner takes it


class Orchestrator(ABC, Generic[T]):
    """`size` actors, the thread that drives them, and the queue of their finished work."""

    def __init__(self, *, name: str, size: int, max_restarts: int,
                 order: Callable[[T], Any] | None = None,
                 cleanup_method: str | None = None, packer: WeightPacker | None = None) -> None:
        self.name = name  # "rollout fleet", "self-play fleet": for errors and the thread
        self.size, self.max_restarts, self.cleanup_method = size, max_restarts, cleanup_method
        self._cv = threading.Condition()  # re-entrant: the queue waits on it too
        self.queue: VersionedQueue[T] = VersionedQueue(order=order, lock=self._cv)
        self._publisher = RayWeightPublisher(packer)  # packer: runtime/weight_sync.py
        # When each version was published and first served (a specialisation hands its
        # workers' `WeightLoad`s to `sync_clock.on_load`, and logs `sync_clock.window()`).
        self.sync_clock = SyncClock()
        self._stop = threading.Event()
        self._fleet: ActorFleet | None = None
        self._thread: threading.Thread | None = None

    # -- what a specialisation says ----------------------------------------------------------
    @abstractmethod
    def _make_worker(self, index: int) -> Any:
        """A new Ray actor handle for slot `index` (called again after each death)."""

    @abstractmethod
    def _dispatch(self, index: int) -> bool:
        """Submit one call to idle actor `index` if there is work for it; whether it did."""

    @abstractmethod
    def _on_report(self, index: int, report: Any) -> None:
        """What actor `index` handed back from its call."""

    @abstractmethod
    def _on_death(self, died: ActorDied) -> None:
        """Actor `died.index` died and was restarted; `died.items` were its work in flight."""

    @abstractmethod
    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed run needs to go on from here."""

    def _prepare(self) -> bool:
        """Before each round of dispatches (admit new work); False: dispatch nothing now."""
        return True

    def _started(self) -> None:
        """Every actor answers: the thread starts next (reset the measuring window)."""

    def _closed(self) -> None:
        """Every actor is gone: release what was reserved for them (a placement group)."""

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, state_dict: dict[str, Any], version: int) -> None:
        """Publish the first weights, build every actor (fail here, not later: one that dies
        meanwhile is restarted) and start the thread."""
        import_ray()
        self.publish(state_dict, version)
        self.sync_clock.forget(version)  # its way to the workers is their start-up
        self._fleet = ActorFleet(self._make_worker, self.size, max_restarts=self.max_restarts)
        self._fleet.call_all("pid", timeout=300, on_death=self._on_death)
        self._started()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"rlscale-{self.name.replace(' ', '-')}")
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self._fleet is not None:
            self._fleet.shutdown(self.cleanup_method)
        self._closed()

    def worker_pids(self) -> list[int]:
        return self._fleet.call_all("pid") if self._fleet else []

    # -- the learner's side (a `WeightPublisher`) -------------------------------------------
    def publish(self, state_dict: dict[str, Any], version: int) -> None:
        """The learner's new weights, for every actor's next call (one `ray.put`). Packed
        and put without the lock: the thread goes on dispatching the old version meanwhile."""
        called_at, start = time.time(), time.perf_counter()
        ref = self._publisher.put(state_dict, version)
        with self._cv:
            self._publisher.swap(ref, version)
            self.sync_clock.on_publish(version, called_at, time.perf_counter() - start)
            self._cv.notify_all()

    def latest(self) -> tuple[int, Any]:
        with self._cv:
            return self._publisher.latest()

    def _take(self, n: int, *, min_version: int | None = None,
              on_stale: Callable[[list[tuple[int, T]]], None] | None = None,
              ) -> list[tuple[int, T]]:
        """The first n finished items (blocks until they are there); call with the lock held
        to record what was taken in the same breath. A stopped fleet is a FleetError."""
        try:
            items = self.queue.take(n, min_version=min_version, on_stale=on_stale)
        except QueueClosed as err:
            raise FleetError(f"the {self.name} stopped: {err}") from None
        with self._cv:
            self._cv.notify_all()  # room in the queue: the thread may dispatch again
        return items

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        fleet = self._fleet
        try:
            while not self._stop.is_set():
                submitted = [self._dispatch(i) for i in fleet.idle()] if self._prepare() else []
                results = fleet.wait(timeout=0.05)
                for index, result in results:
                    if isinstance(result, ActorDied):
                        self._on_death(result)
                    else:
                        self._on_report(index, result)
                if not results and not any(submitted) and len(fleet.idle()) == len(fleet):
                    with self._cv:  # nothing to do until the learner publishes or takes
                        self._cv.wait(timeout=0.05)
        except BaseException as exc:  # surfaced to the learner by its next take
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.queue.fail(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
