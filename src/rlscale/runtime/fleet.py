"""Actor fleets on Ray: an embedded local cluster by default, a real one by address.

Knows nothing of language models or games. A fleet is N actors of one class, each with at
most one call in flight; it restarts an actor that dies and hands back the work items the
dead actor held, so the caller can re-issue them (nothing lost, nothing done twice). Weights
flow through a `RayWeightPublisher`: one `ray.put` per version (packed by
runtime/weight_sync.py where the fleet asks), actors pull the newest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .versions import cpu_snapshot
from .weight_sync import WeightPacker


class FleetError(RuntimeError):
    """The fleet cannot go on (Ray missing, a cluster unreachable, restarts exhausted)."""


class FleetUnavailable(FleetError, ValueError):
    """The fleet cannot start: Ray is missing or the cluster does not answer. A setup error
    (the commands' exit status 2, like a bad config), not a run that failed."""


def import_ray():
    try:
        import ray
    except ImportError:
        raise FleetUnavailable("the fleets (rlvr runtime.mode async/inflight, zero runtime.actors > 0) "
                         "need Ray: pip install 'rlscale[ray]'") from None
    return ray


def check_reachable(address: str, timeout_s: float) -> None:
    """A one-line FleetError unless a TCP connection to the address's `host:port` opens
    within `timeout_s`: Ray itself retries an unreachable cluster forever. Addresses
    without a port (`auto`) are left to Ray."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)),
                                          timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise FleetUnavailable(
                    f"the Ray cluster at {address} is not reachable ({exc.strerror or exc}) "
                    f"after {timeout_s:g} s (runtime.connect_timeout_s); is it running?") from None
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


@contextlib.contextmanager
def ray_session(address: str | None = None, *, num_cpus: int | None = None,
                connect_timeout_s: float = 30.0) -> Iterator[Any]:
    """`ray.init()` for the duration of the block and `ray.shutdown()` after it, whatever
    happens. No address: an embedded local cluster whose files live in a temporary folder
    removed at the end (Ray's own default is a folder in /tmp that outlives the run);
    an address (`ray://...` or `host:port`): join that cluster, once it answers within
    `connect_timeout_s`."""
    ray = import_ray()
    if address and not ray.is_initialized():
        check_reachable(address, connect_timeout_s)
    if ray.is_initialized():  # a caller (a test, a notebook) already owns a session
        yield ray
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray starts its workers at niceness 15: beside a trainer at 0 on the same cores they
    # would starve. Here they are the other half of the work, not background jobs.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # A short path: Ray's socket paths must stay under the 107-byte Unix limit.
    temp_dir = None if address else tempfile.mkdtemp(prefix="rlray-", dir="/tmp")
    # If this process dies (SIGKILL included), the reaper ends the cluster's processes.
    reaper = _start_reaper(temp_dir) if temp_dir else None
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=True,
                                  configure_logging=False)
    # ray.init replaces the SIGTERM handler with a bare sys.exit: keep the command's, which
    # unwinds like Ctrl-C (runtime/errors.py: the resume message, status 143).
    in_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=num_cpus, _temp_dir=temp_dir, **kwargs)
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    except Exception as exc:
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
        _stop_reaper(reaper)
        where = f"the Ray cluster at {address}" if address else "an embedded Ray cluster"
        raise FleetError(f"could not start {where}: {str(exc).splitlines()[0]}") from None
    try:
        yield ray
    finally:
        ray.shutdown()
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
        _stop_reaper(reaper)


def _start_reaper(temp_dir: str) -> subprocess.Popen:
    """runtime/reaper.py watching this process and the cluster's folder (its own session, so
    a signal to this process group does not take it before it has cleaned up)."""
    return subprocess.Popen([sys.executable, "-m", "rlscale.runtime.reaper", str(os.getpid()),
                             temp_dir], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _stop_reaper(reaper: subprocess.Popen | None) -> None:
    """A normal end: the folder is gone and the reaper exits on its own; don't wait for its
    next poll."""
    if reaper is not None and reaper.poll() is None:
        reaper.terminate()
        reaper.wait(timeout=10)


class RayWeightPublisher:
    """The fleet's `WeightPublisher` (runtime/versions.py): the newest weights as one Ray
    object per version (older ones are freed by Ray once no actor holds them); `latest`
    hands back the object's ref, which a worker's next call resolves.

    With a `packer` (the RLVR fleet's) a version goes out as one `WeightPacket`
    (runtime/weight_sync.py: the engine's dtype, in buckets, ties once, LoRA adapters only),
    which every worker on the node maps from the same shared memory; without one (the
    self-play nets, small) as a CPU copy of the state dict."""

    def __init__(self, packer: WeightPacker | None = None) -> None:
        self.version = -1
        self.ref = None
        self.packer = packer

    def put(self, state_dict: dict[str, Any], version: int) -> Any:
        """The version in the object store (its ref), not yet the newest: the learner packs
        and copies without holding up the readers of `latest`."""
        ray = import_ray()
        # Plain CPU tensors: a GPU trainer's weights reach CPU or GPU workers alike.
        payload = (cpu_snapshot(state_dict) if self.packer is None
                   else self.packer.pack(state_dict, version))
        return ray.put(payload)

    def swap(self, ref: Any, version: int) -> None:
        """`ref` (from `put`) is the newest from now on."""
        self.ref, self.version = ref, version

    def publish(self, state_dict: dict[str, Any], version: int) -> None:
        self.swap(self.put(state_dict, version), version)

    def latest(self) -> tuple[int, Any]:
        return self.version, self.ref


@dataclass
class ActorDied:
    """The outcome of a call whose actor died: its work items go back to the caller."""

    index: int
    items: set[int]
    reason: str


@dataclass
class _Member:
    handle: Any
    call: Any = None                      # the ObjectRef of the call in flight, if any
    items: set[int] = field(default_factory=set)
    restarts: int = 0


class ActorFleet:
    """`size` actors made by `make(index)`; one call in flight per actor at most. A dead
    actor is restarted up to `max_restarts` times in a row: a call it answers resets its
    count, so a long run survives any number of isolated deaths and a crash loop (an actor
    that dies again before answering anything) ends it."""

    def __init__(self, make: Callable[[int], Any], size: int, *, max_restarts: int = 10) -> None:
        self.make, self.max_restarts = make, max_restarts
        self.members = [_Member(make(i)) for i in range(size)]
        self.restarts = 0

    def __len__(self) -> int:
        return len(self.members)

    def idle(self) -> list[int]:
        return [i for i, m in enumerate(self.members) if m.call is None]

    def submit(self, index: int, method: str, *args: Any, items: set[int] = frozenset()) -> None:
        member = self.members[index]
        if member.call is not None:
            raise RuntimeError(f"actor {index} already has a call in flight")
        member.items |= set(items)
        member.call = getattr(member.handle, method).remote(*args)

    def done(self, index: int, items: set[int]) -> None:
        """Work items the actor has handed back (finished): no longer its responsibility."""
        self.members[index].items -= set(items)

    def hold(self, index: int, items: set[int]) -> None:
        """The work items the actor holds now, as it reported them (for actors that start
        their own work, such as self-play games): what a restart hands back."""
        self.members[index].items = set(items)

    def wait(self, timeout: float) -> list[tuple[int, Any]]:
        """Results of the calls that finished within `timeout`: (index, value) pairs, the
        value an `ActorDied` (the actor restarted, its items returned) when it died."""
        ray = import_ray()
        calls = {m.call: i for i, m in enumerate(self.members) if m.call is not None}
        if not calls:
            return []
        # Block for the first result, then take whatever else is already done.
        ready, rest = ray.wait(list(calls), num_returns=1, timeout=timeout)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        out = []
        for ref in ready:
            index = calls[ref]
            self.members[index].call = None
            try:
                out.append((index, ray.get(ref)))
                self.members[index].restarts = 0  # alive and answering: not a crash loop
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                    ray.exceptions.ObjectLostError) as exc:
                out.append((index, self._restart(index, exc)))
        return out

    def _restart(self, index: int, exc: BaseException) -> ActorDied:
        member = self.members[index]
        if member.restarts >= self.max_restarts:
            raise FleetError(f"actor {index} died {member.restarts + 1} times in a row; last: "
                             f"{str(exc).splitlines()[0]}") from None
        lost = set(member.items)
        with contextlib.suppress(Exception):
            import_ray().kill(member.handle)
        self.members[index] = _Member(self.make(index), restarts=member.restarts + 1)
        self.restarts += 1
        return ActorDied(index, lost, type(exc).__name__)

    def call_all(self, method: str, *args: Any, timeout: float = 60.0,
                 on_death: Callable[[ActorDied], None] | None = None) -> list[Any]:
        """Call `method` on every actor with no call in flight and wait (setup, queries). An
        actor that dies meanwhile is restarted and called again when `on_death` is given
        (told of each death, as `wait`'s callers are); without it the death is a FleetError."""
        ray = import_ray()
        deadline = time.monotonic() + timeout
        results: list[Any] = [None] * len(self.members)
        calls = {getattr(m.handle, method).remote(*args): i for i, m in enumerate(self.members)}
        while calls:
            ready, _ = ray.wait(list(calls), num_returns=1,
                                timeout=max(deadline - time.monotonic(), 0.0))
            if not ready:
                raise FleetError(f"actors {sorted(calls.values())} did not answer '{method}' "
                                 f"within {timeout:.0f} s")
            index = calls.pop(ready[0])
            try:
                results[index] = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                    ray.exceptions.ObjectLostError) as exc:
                if on_death is None:
                    raise FleetError(f"actor {index} died during '{method}': "
                                     f"{str(exc).splitlines()[0]}") from None
                on_death(self._restart(index, exc))
                calls[getattr(self.members[index].handle, method).remote(*args)] = index
        return results

    def shutdown(self, method: str | None = None) -> None:
        """Let each actor clean up (`method`, best effort), then kill it."""
        ray = import_ray()
        if method:
            with contextlib.suppress(Exception):
                ray.get([getattr(m.handle, method).remote() for m in self.members], timeout=10)
        for m in self.members:
            with contextlib.suppress(Exception):
                ray.kill(m.handle)
        self.members = []
