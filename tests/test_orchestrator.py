"""The orchestrator skeleton both fleets share (runtime/orchestrator.py) and its versioned
queue: items leave in order, stale ones are dropped and counted, a killed actor's work is
re-issued and delivered once, a failure in the thread reaches the learner as one line."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from rlscale.runtime.versions import QueueClosed, VersionedQueue


def test_the_queue_hands_out_in_its_order_and_drops_what_is_too_old():
    queue: VersionedQueue[int] = VersionedQueue(order=lambda item: item)
    for item, version in [(5, 3), (2, 1), (9, 4), (1, 0), (7, 4)]:
        queue.put(item, version)
    stale: list[tuple[int, int]] = []
    assert queue.take(2, min_version=1, on_stale=stale.extend) == [(1, 2), (3, 5)]
    assert stale == [(0, 1)]
    assert len(queue) == 2
    threading.Timer(0.05, lambda: queue.put(3, 9)).start()  # arrives while the taker waits
    assert queue.take(3, timeout=10) == [(9, 3), (4, 7), (4, 9)]


def test_a_taker_waits_for_fresh_items_only():
    queue: VersionedQueue[str] = VersionedQueue()
    queue.put("old", 0)
    with pytest.raises(TimeoutError):
        queue.take(1, timeout=0.05, min_version=1)
    assert len(queue) == 0  # dropped, not kept for later
    threading.Timer(0.05, lambda: queue.fail("actor 0 died 11 times")).start()
    with pytest.raises(QueueClosed, match="11 times"):
        queue.take(1, timeout=10)


def test_a_shared_lock_lets_the_producer_and_queue_change_together():
    lock = threading.Condition()
    queue: VersionedQueue[str] = VersionedQueue(lock=lock)
    with lock:  # the producer holds its lock while it records and puts
        queue.put("a", 0)
        assert len(queue) == 1
    taken: list = []
    taker = threading.Thread(target=lambda: taken.extend(queue.take(2, timeout=10)))
    taker.start()
    time.sleep(0.05)
    with lock:  # the waiting taker does not hold the lock: the producer gets it
        queue.put("b", 1)
    taker.join(10)
    assert taken == [(0, "a"), (1, "b")]


# -- the skeleton on a real embedded Ray -------------------------------------------------------
ray = pytest.importorskip("ray", reason="the fleet tests need Ray (pip install 'rlscale[ray]')")

from rlscale.runtime.fleet import ActorDied, FleetError, import_ray, ray_session  # noqa: E402
from rlscale.runtime.orchestrator import Orchestrator  # noqa: E402


class Squarer:
    """A toy actor: squares the numbers it is given, slowly enough to be killed mid-call."""

    def pid(self) -> int:
        return os.getpid()

    def advance(self, numbers: list[int], weights, version: int) -> tuple[list[int], int]:
        time.sleep(0.2)
        return [n * n for n in numbers], version


class SquareFleet(Orchestrator[tuple[int, int]]):
    """Work items are the numbers 0..total-1, two per call; a finished one is (n, n*n)."""

    def __init__(self, total: int, *, fail_at: int | None = None) -> None:
        super().__init__(name="square fleet", size=2, max_restarts=3, order=lambda x: x[0])
        self.pending = list(range(total))
        self.delivered: list[int] = []
        self.deaths: list[ActorDied] = []
        self.fail_at = fail_at

    def _make_worker(self, index: int):
        return import_ray().remote(num_cpus=0)(Squarer).remote()

    def _dispatch(self, index: int) -> bool:
        numbers, self.pending = self.pending[:2], self.pending[2:]
        if not numbers:
            return False
        version, _ = self.latest()
        self._fleet.submit(index, "advance", numbers, None, version, items=set(numbers))
        return True

    def _on_report(self, index: int, report) -> None:
        squares, version = report
        numbers = [int(round(s ** 0.5)) for s in squares]
        self._fleet.done(index, set(numbers))
        if self.fail_at is not None and self.fail_at in numbers:
            raise ValueError(f"cannot take {self.fail_at}\nsecond line")
        with self._cv:
            for n, s in zip(numbers, squares, strict=True):
                self.delivered.append(n)
                self.queue.put((n, s), version)

    def _on_death(self, died: ActorDied) -> None:
        self.deaths.append(died)
        self.pending = sorted(died.items) + self.pending

    def checkpoint_state(self) -> dict:
        return {"pending": list(self.pending)}

    def take(self, n: int) -> list[tuple[int, int]]:
        return [item for _, item in self._take(n)]


@pytest.fixture(scope="module")
def ray_cluster():
    # The toy actor lives in this test module, which Ray's workers cannot import: send it
    # by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with ray_session(num_cpus=2) as session:
        yield session


def test_a_killed_actor_s_work_is_reissued_and_delivered_once(ray_cluster):
    fleet = SquareFleet(12)
    fleet.start({"w": 0}, 0)
    try:
        first = fleet.take(2)
        os.kill(fleet.worker_pids()[0], signal.SIGKILL)
        rest = fleet.take(10)
    finally:
        fleet.close()
    assert sorted(first + rest) == [(n, n * n) for n in range(12)]
    assert sorted(fleet.delivered) == list(range(12))  # each once, the killed call redone
    assert [d.index for d in fleet.deaths] == [0]


def test_a_failure_in_the_thread_reaches_the_learner_as_one_line(ray_cluster):
    fleet = SquareFleet(8, fail_at=5)
    fleet.start({"w": 0}, 0)
    try:
        with pytest.raises(FleetError) as err:
            fleet.take(8)
    finally:
        fleet.close()
    assert str(err.value) == "the square fleet stopped: ValueError: cannot take 5"


def test_publish_is_what_the_next_call_sees(ray_cluster):
    fleet = SquareFleet(40)
    fleet.start({"w": 0}, 0)
    try:
        fleet.take(2)
        fleet.publish({"w": 1}, 7)
        assert fleet.latest()[0] == 7
        versions = [v for v, _ in fleet.queue.take(1, min_version=7, timeout=30)]
    finally:
        fleet.close()
    assert versions == [7]
