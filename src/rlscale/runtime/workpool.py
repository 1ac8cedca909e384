"""Run picklable callables in persistent worker processes, each call under a deadline.

A call that runs past its deadline, kills its worker (segfault, `os._exit`) or raises
(including `MemoryError` from the worker's address-space limit) comes back as a typed
outcome, never as an exception in the caller: the worker is replaced and the pool goes on.

Workers are fresh interpreters started with `subprocess` (fork + exec, as multiprocessing's
`spawn` does) and never plain `fork`: the parent may hold torch and Ray threads whose locks a
forked child would inherit. They run `_worker_main` directly instead of re-importing the
parent's `__main__` (which multiprocessing's spawn does, and which would pull torch into
every worker). Calls travel in chunks, one pipe message per chunk; each result comes back as
soon as it is ready, so the parent knows which call is running and the deadline is per call.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

# A ready worker holds ~100 MB of address space (~20 MB resident; most of the rest is its
# watchdog thread's stack and malloc arena); importing numpy adds ~120 MB, torch ~620 MB
# (/proc/PID/status VmSize, Python 3.11). 2 GiB leaves every real verifier room while a
# runaway allocation fails fast instead of swapping the machine.
DEFAULT_MEMORY_MB = 2048
START_TIMEOUT_S = 60.0  # a cold interpreter on a loaded 2-core machine can take seconds


@dataclass(frozen=True, slots=True)
class Ok:
    value: Any


@dataclass(frozen=True, slots=True)
class Timeout:
    seconds: float


@dataclass(frozen=True, slots=True)
class Crash:
    """The worker died during the call; `exit_status` < 0 is the signal that killed it."""

    exit_status: int | None

    def describe(self) -> str:
        if self.exit_status is not None and self.exit_status < 0:
            try:
                return f"worker died ({signal.Signals(-self.exit_status).name})"
            except ValueError:
                pass
        return f"worker died (exit status {self.exit_status})"


@dataclass(frozen=True, slots=True)
class Error:
    message: str  # "TypeName: text", one line


Outcome = Ok | Timeout | Crash | Error


class WorkerStartError(RuntimeError):
    """A fresh worker died before it was ready: a setup problem (memory limit too low,
    unimportable package), not a bad call, so it is raised instead of counted."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------- worker

_BOOT = ("import json, sys; config = json.loads(sys.argv[1]); sys.path[:] = config['sys_path']; "
         "from rlscale.runtime.workpool import _worker_main; _worker_main(config)")


def _limit_resources(memory_mb: int | None) -> None:
    # No core files: a segfaulting verifier would otherwise drop one per crash in the cwd.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_mb is not None:
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _die_with_parent(parent_pid: int, kernel_signal: bool) -> None:
    """Exit when the parent does, even mid-call: a verifier stuck in a loop must not outlive
    a trainer that was SIGKILLed. PR_SET_PDEATHSIG fires when the *thread* that spawned us
    exits, so the parent only asks for it from its main thread; the watchdog thread covers
    the rest (unless a call holds the GIL in C code for good)."""
    if kernel_signal and sys.platform == "linux":
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, name="workpool-watchdog", daemon=True).start()


def _worker_main(config: dict[str, Any]) -> None:
    # Ctrl-C reaches the whole process group; the parent decides what to do with it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(config["parent_pid"], config["pdeathsig"])
    _limit_resources(config["memory_mb"])
    for module in config.get("preload", ()):  # before "ready": no call's deadline pays for it
        importlib.import_module(module)
    inbox = Connection(config["inbox_fd"], writable=False)
    outbox = Connection(config["outbox_fd"], readable=False)
    outbox.send_bytes(pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            message = inbox.recv_bytes()
        except EOFError:  # the parent closed the pool (or died)
            return
        try:
            fn, calls = pickle.loads(message)
        except BaseException as exc:  # e.g. the callable's module is not importable here
            outbox.send_bytes(pickle.dumps(("chunk-error", one_line(exc))))
            continue
        for args in calls:
            try:
                result = ("ok", fn(*args))
            except BaseException as exc:  # MemoryError and SystemExit are the call's fault too
                result = ("error", one_line(exc))
            try:
                reply = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as exc:
                reply = pickle.dumps(("error", "result not picklable: " + one_line(exc)))
            outbox.send_bytes(reply)


# ---------------------------------------------------------------------------------- parent

@dataclass(eq=False)
class _Worker:
    process: subprocess.Popen
    inbox: Connection    # parent -> worker
    outbox: Connection   # worker -> parent
    pending: deque[int] = field(default_factory=deque)  # sent, unanswered, in running order
    received: bytearray = field(default_factory=bytearray)  # replies read, not yet parsed
    started: float = 0.0  # when the parent last saw progress: the head call began no earlier

    def stop(self, kill: bool) -> int | None:
        """End the process and reap it; returns its exit status."""
        for conn in (self.inbox, self.outbox):
            conn.close()
        if kill and self.process.returncode is None:
            # The whole process group: whatever the call started (a solver subprocess) goes too.
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            return self.process.wait(timeout=2.0)  # an idle worker exits at EOF at once
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def _spawn(memory_mb: int | None, preload: Sequence[str] = ()) -> _Worker:
    inbox_read, inbox_write = os.pipe()
    outbox_read, outbox_write = os.pipe()
    config = {"inbox_fd": inbox_read, "outbox_fd": outbox_write, "memory_mb": memory_mb,
              "parent_pid": os.getpid(), "sys_path": [str(p) for p in sys.path],
              "pdeathsig": threading.current_thread() is threading.main_thread(),
              "preload": list(preload)}
    # One core's worth of threads per worker: a pool must not oversubscribe the machine.
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    try:
        process = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(config)],
                                   pass_fds=(inbox_read, outbox_write), stdin=subprocess.DEVNULL,
                                   env=env, close_fds=True, process_group=0)
    finally:
        os.close(inbox_read)
        os.close(outbox_write)
    worker = _Worker(process, Connection(inbox_write, readable=False),
                     Connection(outbox_read, writable=False))
    try:
        if not worker.outbox.poll(START_TIMEOUT_S):
            raise WorkerStartError(f"worker not ready after {START_TIMEOUT_S:.0f}s")
        worker.outbox.recv_bytes()
    except (EOFError, OSError, WorkerStartError) as exc:
        status = worker.stop(kill=True)
        raise WorkerStartError(f"worker failed to start (exit status {status}, memory_mb="
                               f"{memory_mb}): {one_line(exc)}") from None
    return worker


def _stop_all(workers: list[_Worker], owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked copy of the parent must not kill its workers
        return
    while workers:
        worker = workers.pop()
        worker.stop(kill=bool(worker.pending))


class _PoolDefault:
    pass


_POOL_DEFAULT = _PoolDefault()


class WorkPool:
    """`workers` persistent processes running `fn(*args)` calls under a per-call deadline.

    `map` is thread-safe: concurrent calls take turns (a lock), each using every worker.
    `close()` (or leaving a `with` block, or interpreter exit) stops and reaps every worker.
    `preload` names modules every worker (a replacement too) imports before it is ready, so
    that the first call after a start does not spend its deadline importing them.
    """

    def __init__(self, workers: int = 1, *, timeout_s: float | None = None,
                 memory_mb: int | None = DEFAULT_MEMORY_MB, preload: Sequence[str] = ()):
        if workers < 1:
            raise ValueError(f"need at least one worker, got {workers}")
        if memory_mb is not None and memory_mb < 128:  # a ready worker maps ~100 MB
            raise ValueError(f"memory_mb={memory_mb} is too small for a Python interpreter")
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.preload = tuple(preload)
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop_all, self._workers, os.getpid())
        try:
            for _ in range(workers):
                self._workers.append(_spawn(memory_mb, self.preload))
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> WorkPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def map(self, fn: Callable[..., Any], calls: Sequence[tuple], *,
            timeout_s: float | None | _PoolDefault = _POOL_DEFAULT) -> list[Outcome]:
        """`[fn(*args) for args in calls]` in the workers, as outcomes in the same order;
        `timeout_s` (per call, None: no deadline) defaults to the pool's."""
        timeout = self.timeout_s if isinstance(timeout_s, _PoolDefault) else timeout_s
        with self._lock:
            if self._closed:
                raise RuntimeError("map on a closed WorkPool")
            try:
                return _Run(self, fn, list(calls), timeout).run()
            except BaseException:
                # Interrupted (Ctrl-C, a failed respawn): busy workers hold calls and replies
                # of this run; kill them so the next map starts clean (dispatch respawns them).
                for worker in self._workers:
                    if worker.pending:
                        worker.pending.clear()
                        worker.stop(kill=True)
                raise


class _Run:
    """One `map` call: dispatch chunks to idle workers, collect results, enforce deadlines."""

    def __init__(self, pool: WorkPool, fn: Callable, calls: list[tuple], timeout_s: float | None):
        self.pool, self.fn, self.calls, self.timeout_s = pool, fn, calls, timeout_s
        self.outcomes: list[Outcome | None] = [None] * len(calls)
        self.queue: deque[int] = deque(range(len(calls)))
        workers = len(pool._workers)
        # One chunk (one round trip) per worker when alone; several otherwise, so a worker
        # that draws slow calls does not leave the others idle at the end.
        self.chunk_size = max(1, math.ceil(len(calls) / (workers if workers == 1 else 4 * workers)))

    def run(self) -> list[Outcome]:
        workers = self.pool._workers
        while True:
            for i, worker in enumerate(workers):
                if not worker.pending and self.queue:
                    self._dispatch(i)
            busy = [w for w in workers if w.pending]
            if not busy:
                break
            wait_s = None
            if self.timeout_s is not None:
                first_deadline = min(w.started for w in busy) + self.timeout_s
                wait_s = max(0.0, first_deadline - time.monotonic())
            ready, _, _ = select.select([w.outbox.fileno() for w in busy], [], [], wait_s)
            for i, worker in enumerate(workers):
                if worker.pending and worker.outbox.fileno() in ready:
                    self._collect(i)
            if self.timeout_s is not None:
                now = time.monotonic()
                for i, worker in enumerate(workers):
                    if worker.pending and now >= worker.started + self.timeout_s:
                        self._settle(i, Timeout(self.timeout_s), kill=True)
        return self.outcomes  # type: ignore[return-value]

    def _dispatch(self, i: int) -> None:
        worker = self.pool._workers[i]
        if worker.process.poll() is not None:  # died while idle: no call to blame
            worker.stop(kill=True)
            worker = self.pool._workers[i] = _spawn(self.pool.memory_mb, self.pool.preload)
        chunk = list(itertools.islice(self.queue, self.chunk_size))
        # Pickled before any state changes: an unpicklable callable raises to the caller.
        message = pickle.dumps((self.fn, [self.calls[j] for j in chunk]),
                               protocol=pickle.HIGHEST_PROTOCOL)
        for _ in chunk:
            self.queue.popleft()
        worker.pending.extend(chunk)
        worker.started = time.monotonic()
        try:
            worker.inbox.send_bytes(message)
        except OSError:  # it died between the check and the send: the next wait sees EOF
            pass

    def _collect(self, i: int) -> None:
        # One read takes every reply waiting in the pipe (Connection.recv_bytes would take
        # two reads and a poll per reply): at 256 trivial calls that is most of the overhead.
        worker = self.pool._workers[i]
        data = os.read(worker.outbox.fileno(), 1 << 20)
        if not data:  # EOF: the worker died; replies it sent before are already parsed
            self._settle(i, None, kill=True)
            return
        buffer = worker.received
        buffer += data
        answered, at = len(worker.pending), 0
        while worker.pending and len(buffer) - at >= 4:
            (size,) = struct.unpack_from("!i", buffer, at)  # multiprocessing's frame header
            if len(buffer) - at - 4 < size:
                break
            kind, payload = pickle.loads(buffer[at + 4: at + 4 + size])
            at += 4 + size
            if kind == "chunk-error":
                for j in worker.pending:
                    self.outcomes[j] = Error(payload)
                worker.pending.clear()
            else:
                self.outcomes[worker.pending.popleft()] = (
                    Ok(payload) if kind == "ok" else Error(payload))
        del buffer[:at]
        if len(worker.pending) < answered:
            worker.started = time.monotonic()

    def _settle(self, i: int, outcome: Outcome | None, *, kill: bool) -> None:
        """The head call ends the worker (timeout: we kill it; crash: it died): record the
        outcome, give the rest of its chunk back to the queue, start a replacement."""
        worker = self.pool._workers[i]
        status = worker.stop(kill=kill)
        head = worker.pending.popleft()
        self.outcomes[head] = outcome if outcome is not None else Crash(status)
        self.queue.extendleft(reversed(worker.pending))
        worker.pending.clear()
        self.pool._workers[i] = _spawn(self.pool.memory_mb, self.pool.preload)


__all__ = ["WorkPool", "Outcome", "Ok", "Timeout", "Crash", "Error", "WorkerStartError",
           "DEFAULT_MEMORY_MB", "one_line"]
