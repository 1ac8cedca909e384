"""Run untrusted Python code in a contained process: the sandbox behind the `python` tool.

`run_python(code, limits)` starts a fresh `python -I -S` running the boot program
(sandbox_boot.py, its config on stdin) and returns a `SandboxRun`: the output (stdout and
stderr interleaved, read with a cap, never buffered past it) and why the run ended (`cause`). It is called in a `WorkPool` worker, whose
deadline is a backstop behind the sandbox's own: a killed worker takes its call along.

Process tree of one call:

    caller (a pool worker)
      boot      sandbox_boot.py: limits, namespaces, then forks init and waits on it
        init    pid 1 of a new pid namespace (namespaces mode); forks, reaps, reports
          code  a fresh `python -I -S -u` running the code; what it starts lives below

Why a separate process and not the worker itself: the code must lose what the worker has
(the caller's files, network, uid, environment), and every process it starts must be
findable and killable afterwards; only a fresh process tree under new namespaces gives both.

What holds with `isolation="namespaces"` (Linux with user namespaces; `probe` says whether
this machine allows them; root and unprivileged users alike):
- wall deadline (the caller kills the call) and CPU time (RLIMIT_CPU, per process);
- memory: RLIMIT_AS on every process, and where a control group can be made
  (runtime/cgroups.py) a cap of `memory_mb + disk_mb` on all the call holds, memfd and tmpfs
  pages included; where none can, the calls that hold pages outside RLIMIT_AS (memfd_create,
  SysV shared memory and message queues) fail with ENOMEM;
- output: at most `max_output_bytes` are read; past that the call is killed;
- processes: RLIMIT_NPROC, which the kernel counts per user namespace, so the cap is this
  call's own (boot and init count towards it), and the group's `pids.max` where there is one;
  root runs the code as `nobody` outside, since the kernel never applies RLIMIT_NPROC to root;
- every process is gone after the call: killing init ends its pid namespace, whatever the
  code did (setsid, double fork, ignoring signals); if the caller dies, the death signal
  runs down boot -> init and the namespace ends the same way;
- no network: a new network namespace has only a loopback interface, which is down, so
  neither the internet nor the machine's own local services are reachable; the socket
  families that reach past a network namespace (AF_VSOCK, AF_NETLINK, AF_PACKET, ...) are
  refused by a seccomp filter (runtime/seccomp.py), which also refuses the kernel keyring,
  ptrace, bpf, io_uring, mounts, modules and the other calls it lists;
- no keys: boot joins a new, empty session keyring, and the filter refuses keyctl;
- files: the code sees a new root (pivot_root, the old root detached): the system
  read-only (/usr, /bin, /lib*, the Python installation, a few /dev nodes) and its own
  writable /work (a tmpfs of `disk_mb`, also /tmp and HOME, gone with the call). /etc,
  /home, /root (but for the Python installation), the project and every other path of the
  machine do not exist for it; the read-only paths can be read;
- the code runs as a uid without capabilities (no_new_privs; nested user namespaces are
  switched off), so it cannot remount, unmount or unshare its way out of the above.

With `isolation="rlimits"` (no user namespaces, e.g. under Ubuntu's AppArmor restriction;
only when asked for by name) the deadline, CPU, memory and output caps, the cgroup, the seccomp
filter (with AF_UNIX the only socket family: no network) and the new keyring hold, the code
runs as `nobody` when the caller is root, and a fresh temporary working directory is also
HOME and TMPDIR, removed after the call. Boot is a child subreaper: every process the code
left behind, setsid or not, is killed when the call ends. Not contained there: reading any
file `nobody` (or the unprivileged caller) may read, and writing where it may write
(RLIMIT_FSIZE caps each file, not their number); AF_UNIX sockets of the machine's services;
processes (RLIMIT_NPROC counts all of the uid's processes); and a caller that is not root runs
the code as itself, which may then kill boot and leave setsid processes behind. Use it only
for code you trust.

Why a call failed (`cause`) is decided here, not read from the code's exit status: the
deadline and the output cap by the caller, memory by the group's OOM kills or by the code's
own process reporting an uncaught MemoryError (or ENOMEM), CPU time by init from the code's
measured CPU seconds; a non-zero exit of the code's own choosing is `exit`.

Not contained in either mode: the rest of the kernel's attack surface, and CPU and memory
bandwidth while the code runs (at nice +10, so the caller keeps its deadline).

This module, like the boot program, imports only the standard library (and its siblings
cgroups.py, seccomp.py, sandbox_boot.py): the tests also run it under the system's Python.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

if __package__:
    from . import cgroups, sandbox_boot, seccomp
else:  # imported by path (the tests run it under the system's Python): its modules beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cgroups
    import sandbox_boot
    import seccomp

Isolation = Literal["namespaces", "rlimits"]
Cause = Literal["ok", "error", "exit", "timeout", "memory", "output_limit", "crashed"]

MAX_CODE_CHARS = 100_000  # code travels through a pipe: the limit is this, not argv's 128 KiB
# What of the machine the code sees, read-only (namespaces mode), besides the Python
# installation and a few device nodes. Symlinks (merged /usr) are recreated as symlinks.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    deadline_s: float = 5.0
    memory_mb: int = 512          # address space of each process (RLIMIT_AS)
    max_output_bytes: int = 65_536
    max_processes: int = 16       # RLIMIT_NPROC (namespaces: this call's processes)
    disk_mb: int = 64             # the writable /work (namespaces mode)
    isolation: Isolation = "namespaces"

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError(f"sandbox deadline_s must be > 0, got {self.deadline_s}")
        if self.memory_mb < 64:  # `python -I -S` maps ~20 MB; leave the code some room
            raise ValueError(f"sandbox memory_mb must be >= 64, got {self.memory_mb}")
        if self.max_output_bytes < 1 or self.max_processes < 3 or self.disk_mb < 1:
            raise ValueError("sandbox max_output_bytes and disk_mb must be >= 1 and "
                             f"max_processes >= 3 (boot, init, code), got {self}")
        if self.isolation not in ("namespaces", "rlimits"):
            raise ValueError(f"sandbox isolation must be namespaces or rlimits, "
                             f"got {self.isolation!r}")


@dataclass(frozen=True, slots=True)
class SandboxRun:
    output: str            # stdout and stderr as written, at most max_output_bytes of them
    cause: Cause
    exit_status: int | None  # the code's process: exit code, or -signal; None if unknown
    seconds: float

    @property
    def ok(self) -> bool:
        return self.cause == "ok"


# ---------------------------------------------------------------------------- the caller

def python_executable() -> str:
    """The real interpreter (a venv's python is a symlink; the sandbox needs no venv)."""
    return os.path.realpath(sys.executable)


def visible_paths() -> list[str]:
    """Host paths bound read-only into the sandbox's root (namespaces mode)."""
    paths = [p for p in SYSTEM_PATHS if os.path.lexists(p)]
    prefix = os.path.realpath(sys.base_prefix)
    if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
        paths.append(prefix)
    executable_dir = os.path.dirname(python_executable())
    if not any(executable_dir == p or executable_dir.startswith(p + "/") for p in paths):
        paths.append(executable_dir)
    return paths


def run_python(code: str, limits: SandboxLimits) -> SandboxRun:
    """Run `code` as a script in a fresh contained process; what it prints is the output,
    and the value of a final expression is printed too (as in a notebook)."""
    start = time.monotonic()
    if len(code) > MAX_CODE_CHARS:
        return SandboxRun(f"code longer than {MAX_CODE_CHARS} characters", "error", None, 0.0)
    if "\x00" in code:
        return SandboxRun("code contains a NUL character", "error", None, 0.0)
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as exc:
        return SandboxRun(f"code is not valid UTF-8: {exc.reason}", "error", None, 0.0)
    # Namespaces: the new root and /work are tmpfs mounts that only the call's mount
    # namespace has, so nothing is left on the machine even when the call is killed.
    workdir = None
    run_as = sandbox_boot.NOBODY_ID if limits.isolation == "rlimits" and os.getuid() == 0 else None
    if limits.isolation == "rlimits":
        workdir = tempfile.mkdtemp(prefix="rlscale-sandbox-")
        if run_as is not None:
            os.chown(workdir, run_as, run_as)
    group = cgroups.CallGroup.create((limits.memory_mb + limits.disk_mb) * 2**20,
                                     limits.max_processes)
    out_read, out_write = os.pipe()
    status_read, status_write = os.pipe()
    config = {"code": code, "isolation": limits.isolation, "memory_mb": limits.memory_mb,
              "cpu_s": math.ceil(limits.deadline_s) + 1, "max_processes": limits.max_processes,
              "disk_mb": limits.disk_mb, "workdir": workdir, "status_fd": status_write,
              "python": python_executable(), "visible": visible_paths(),
              "parent_pid": os.getpid(), "run_as": run_as,
              "cgroup_procs": group.procs_files if group else [], "memfd": group is not None}
    process = init_pid = report = None
    try:
        process = subprocess.Popen(
            [python_executable(), "-I", "-S", os.path.abspath(sandbox_boot.__file__)],
            stdin=subprocess.PIPE, stdout=out_write, stderr=out_write, pass_fds=(status_write,),
            cwd=workdir or "/", env=sandbox_boot.environment(workdir or "/"), close_fds=True,
            process_group=0)
        os.close(out_write)
        os.close(status_write)
        out_write = status_write = -1
        try:  # boot reads all of it before anything else
            process.stdin.write(json.dumps(config).encode())
            process.stdin.close()
        except BrokenPipeError:
            pass
        output, report, init_pid, cause = _watch(out_read, status_read,
                                                 start + limits.deadline_s,
                                                 limits.max_output_bytes)
    finally:
        for fd in (out_write, status_write):
            if fd >= 0:
                os.close(fd)
        _end(process, init_pid, report is not None)
        for fd in (out_read, status_read):
            os.close(fd)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        oom_kills = group.oom_kills() if group else 0
        if group is not None:
            group.remove()
    seconds = time.monotonic() - start
    text = output.decode("utf-8", errors="replace")
    # None: the code never ran (boot or init failed, or the interpreter could not start)
    exit_status = _exit_status(report.wait_status) if report and report.claim != "start" \
        else None
    if cause is None:
        cause = "memory" if oom_kills else _cause(report, config["cpu_s"])
    return SandboxRun(text, cause, exit_status, seconds)


@dataclass(frozen=True, slots=True)
class _Report:
    """What init saw of the code's process: its wait status, the CPU seconds it used, and
    what it said of an uncaught exception ('error', 'memory'; 'start': the interpreter could
    not be started; '' for none)."""

    wait_status: int
    cpu_s: float
    claim: str


def _watch(out_read: int, status_read: int, deadline: float, max_bytes: int
           ) -> tuple[bytes, _Report | None, int | None, Cause | None]:
    """Read the output (at most `max_bytes` + 1) and init's reports until the code has
    ended and its output is drained, the deadline passes or the output overflows."""
    output, reports = bytearray(), bytearray()
    open_fds = {out_read, status_read}
    report = init_pid = None
    drain_until = math.inf  # once boot and init are gone: what is still in the pipe, briefly
    while open_fds:
        now = time.monotonic()
        if now >= deadline:
            return bytes(output), report, init_pid, "timeout"
        if now >= drain_until:
            break
        ready, _, _ = select.select(list(open_fds), [], [],
                                    min(deadline, drain_until) - now)
        for fd in ready:
            data = os.read(fd, 65_536)
            if not data:
                open_fds.discard(fd)
                if fd == status_read:
                    drain_until = time.monotonic() + 0.2
            elif fd == out_read:
                output += data
                if len(output) > max_bytes:
                    return bytes(output[:max_bytes]), report, init_pid, "output_limit"
            else:
                reports += data
                init_pid, report = _parse_reports(reports, init_pid, report)
    return bytes(output), report, init_pid, None


def _parse_reports(reports: bytearray, init_pid: int | None, report: _Report | None
                   ) -> tuple[int | None, _Report | None]:
    for line in bytes(reports).split(b"\n")[:-1]:  # complete lines only
        kind, _, value = line.decode().partition(" ")
        if kind == "init":
            init_pid = int(value)
        elif kind == "exit":
            status, cpu_s, claim = value.split(" ")
            report = _Report(int(status), float(cpu_s), claim.strip("-"))
    return init_pid, report


def _end(process: subprocess.Popen | None, init_pid: int | None, init_reported: bool) -> None:
    """Kill everything the call started, then reap boot. Namespaces: killing init ends its
    pid namespace, and boot, which waits on init, exits only once every process there is
    gone. Boot is reaped last, so its pid (the process group's id) cannot be reused before
    the group is killed."""
    if process is None:
        return
    if init_pid is not None and not init_reported and not _exited(process.pid):
        try:  # still boot's unreaped child, so the pid is init's
            os.kill(init_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0
    while not _exited(process.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        os.killpg(process.pid, signal.SIGKILL)  # boot, and (rlimits) what the code left behind
    except ProcessLookupError:
        pass
    process.wait()


def _exited(pid: int) -> bool:
    """Whether our child `pid` has exited, without reaping it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _exit_status(wait_status: int | None) -> int | None:
    if wait_status is None:
        return None
    return os.waitstatus_to_exitcode(wait_status)


def _cause(report: _Report | None, cpu_limit_s: int) -> Cause:
    """Why the code's process ended, from init's report (the deadline, the output cap and the
    group's OOM kills are the caller's own findings, decided before this)."""
    if report is None or report.claim == "start":  # the code never ran, or init was killed
        return "crashed"
    exit_status = os.waitstatus_to_exitcode(report.wait_status)
    if exit_status == 0:
        return "ok"
    if exit_status < 0:
        # RLIMIT_CPU sends SIGXCPU, then SIGKILL: a timeout only if the CPU time was spent
        spent = report.cpu_s >= cpu_limit_s - 0.5
        return "timeout" if spent and -exit_status in (signal.SIGXCPU, signal.SIGKILL) \
            else "crashed"
    if report.claim in ("error", "memory"):
        return report.claim
    return "exit"


def describe(run: SandboxRun, limits: SandboxLimits) -> str:
    """One line saying why a run failed (the output, for an exception, says more)."""
    match run.cause:
        case "timeout":
            return f"timed out after {limits.deadline_s:g}s"
        case "memory":
            return f"MemoryError: over the {limits.memory_mb} MB memory limit"
        case "output_limit":
            return f"output over {limits.max_output_bytes} bytes"
        case "crashed":
            if run.exit_status is None:  # the code never ran: boot's error is the last line
                last = run.output.strip().splitlines()[-1:] or ["no output"]
                return f"sandbox failed to start: {last[0][:300]}"
            if run.exit_status < 0:
                try:
                    return f"crashed ({signal.Signals(-run.exit_status).name})"
                except ValueError:
                    pass
            last = run.output.strip().splitlines()[-1:] or ["no output"]
            return f"crashed (exit status {run.exit_status}): {last[0][:200]}"
        case "error":
            last = run.output.strip().splitlines()[-1:] or [f"exit status {run.exit_status}"]
            return last[0][:300]
        case "exit":
            return f"exited with status {run.exit_status}"
    return "ok"


_probed: dict[str, str | None] = {}


def probe(isolation: Isolation = "namespaces") -> str | None:
    """None when `isolation` works on this machine, else why not (one line); cached."""
    if isolation not in _probed:
        problem = seccomp.available()
        if problem is None:
            limits = SandboxLimits(deadline_s=30.0, memory_mb=256, isolation=isolation)
            try:
                run = run_python("print(6 * 7)", limits)
            except OSError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                problem = None if run.ok and run.output.strip() == "42" else describe(run, limits)
        _probed[isolation] = problem
    return _probed[isolation]
