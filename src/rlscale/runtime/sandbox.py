"""Run untrusted Python code in a contained process: the sandbox behind the `python` tool.

`run_python(code, limits)` starts a fresh `python -I -S` (this file is its boot program) and
returns a `SandboxRun`: the output (stdout and stderr interleaved, read with a cap, never
buffered past it) and why the run ended (`cause`). It is called in a `WorkPool` worker, whose
deadline is a backstop behind the sandbox's own: a killed worker takes its call along.

Process tree of one call:

    caller (a pool worker)
      boot      this file: limits, namespaces, then forks init and waits on it
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

This module imports only the standard library: it runs as the boot program under `-I -S`.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import platform
import resource
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
    from . import cgroups, seccomp
else:  # the boot program (`python -I -S sandbox.py`): its two helpers beside it, stdlib only
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cgroups
    import seccomp

Isolation = Literal["namespaces", "rlimits"]
Cause = Literal["ok", "error", "exit", "timeout", "memory", "output_limit", "crashed"]

MAX_CODE_CHARS = 100_000  # code travels through a pipe: the limit is this, not argv's 128 KiB
REPORT_FD = 3          # the code's process reports an uncaught exception here ("error", "memory")
INSIDE_ID = 1000       # the uid and gid the code has inside its user namespace (not root)
NOBODY_ID = 65534      # what root runs the code as, outside (see _map_ids)
# What of the machine the code sees, read-only (namespaces mode), besides the Python
# installation and a few device nodes. Symlinks (merged /usr) are recreated as symlinks.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
PIVOT_ROOT_SYSCALL = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41,
                      "ppc64le": 203, "s390x": 217}
KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219, "arm64": 219, "riscv64": 219,
                  "ppc64le": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1
# SysV IPC of the call's own IPC namespace, set to nothing (namespaces mode; best effort).
IPC_SYSCTLS = ("shmmni", "shmall", "shmmax", "msgmni")


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
    run_as = NOBODY_ID if limits.isolation == "rlimits" and os.getuid() == 0 else None
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
            [python_executable(), "-I", "-S", os.path.abspath(__file__)],
            stdin=subprocess.PIPE, stdout=out_write, stderr=out_write, pass_fds=(status_write,),
            cwd=workdir or "/", env=_environment(workdir or "/"), close_fds=True,
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


def _environment(home: str) -> dict[str, str]:
    # Nothing of the caller's environment: no tokens, no proxies, no PYTHON* variables.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home,
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


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


# ------------------------------------------------------------------------- boot (the child)

def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def _locked_flags(path: str) -> int:
    """The flags a read-only remount must keep: in a user namespace, those the original mount
    had are locked (dropping one is EPERM)."""
    f_flag = os.statvfs(path).f_flag
    flags = 0
    for st, ms in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                   (os.ST_NODIRATIME, MS_NODIRATIME)):
        if f_flag & st:
            flags |= ms
    if f_flag & os.ST_NOATIME:
        flags |= MS_NOATIME
    elif f_flag & os.ST_RELATIME:
        flags |= MS_RELATIME
    else:
        flags |= MS_STRICTATIME
    return flags


@dataclass(frozen=True, slots=True)
class _Source:
    """A host path to show inside, opened (O_PATH) while boot can still reach it."""

    path: str
    fd: int | None        # None: a symlink, recreated as one
    link: str | None
    flags: int            # the remount's locked flags (directories only)

    @classmethod
    def open(cls, path: str, device: bool = False) -> _Source:
        if os.path.islink(path):
            return cls(path, None, os.readlink(path), 0)
        return cls(path, os.open(path, os.O_PATH | os.O_CLOEXEC), None,
                   0 if device else _locked_flags(path))


def _show(libc: ctypes.CDLL, source: _Source, root: str, read_only: bool) -> None:
    target = root + source.path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if source.link is not None:  # merged /usr: /lib -> usr/lib stays a link into the new root
        os.symlink(source.link, target)
        return
    if read_only:
        os.makedirs(target, exist_ok=True)
    else:  # a device node: bind it onto an empty file
        open(target, "w").close()
    _mount(libc, f"/proc/self/fd/{source.fd}", target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(libc, None, target, None,
               MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | source.flags)


def _map_ids(pid: int, uid: int, gid: int) -> None:
    """Map INSIDE_ID in `pid`'s new user namespace to an outside uid and gid; run by a helper
    left in the parent namespace. Root maps to `nobody`: RLIMIT_NPROC never binds global
    root, even in a namespace; and root's files and groups are then out of the code's reach."""
    targets = [(NOBODY_ID, NOBODY_ID), (uid, gid)] if uid == 0 else [(uid, gid)]
    for outside_uid, outside_gid in targets:
        try:
            if uid != 0:  # unprivileged: gid_map needs setgroups denied first
                _write(f"/proc/{pid}/setgroups", "deny")
            _write(f"/proc/{pid}/uid_map", f"{INSIDE_ID} {outside_uid} 1")
            _write(f"/proc/{pid}/gid_map", f"{INSIDE_ID} {outside_gid} 1")
            return
        except OSError as exc:
            error = exc
    raise error


def _unshare(libc: ctypes.CDLL) -> None:
    """New user, mount, network, pid, IPC and UTS namespaces; INSIDE_ID mapped."""
    uid, gid = os.getuid(), os.getgid()
    go_read, go_write = os.pipe()
    helper = os.fork()
    if helper == 0:  # a process can map no id but its own from inside: a helper outside does
        try:
            os.close(go_write)
            os.read(go_read, 1)
            _map_ids(os.getppid(), uid, gid)
            os._exit(0)
        except BaseException as exc:
            os.write(2, f"sandbox: mapping ids failed: {exc}\n".encode())
            os._exit(1)
    os.close(go_read)
    try:
        _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
                            | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    finally:
        os.write(go_write, b"x")
        os.close(go_write)
        _, status = os.waitpid(helper, 0)
    if status != 0:
        raise OSError("mapping the sandbox's uid and gid failed")


def _become_inside_user(root_outside: bool) -> None:
    """Boot keeps every capability in its namespace through this (the namespace's uid 0 is
    unmapped); the code's process drops them all at exec, being INSIDE_ID there."""
    if root_outside:
        os.setgroups([])  # root's supplementary groups would still open files to the code
    os.setresgid(INSIDE_ID, INSIDE_ID, INSIDE_ID)
    os.setresuid(INSIDE_ID, INSIDE_ID, INSIDE_ID)
    for name in ("max_user_namespaces", "max_mnt_namespaces"):
        try:  # the code may not nest namespaces of its own (best effort: older kernels)
            _write(f"/proc/sys/user/{name}", "0")
        except OSError:
            pass


def _enter_namespaces(libc: ctypes.CDLL, config: dict) -> None:
    """Namespaces, then a new root: the system read-only, /work writable, the old root
    detached, so that nothing else of the machine can be named. Runs as boot, before any code."""
    root_outside = os.getuid() == 0
    _unshare(libc)
    for name in IPC_SYSCTLS:  # this IPC namespace's SysV limits: no segments, no queues
        try:
            _write(f"/proc/sys/kernel/{name}", "0")
        except OSError:
            pass
    # Opened in the new mount namespace (a bind takes no mount of another one), while boot
    # is still its outside uid: as nobody it may not search the directories above them.
    sources = [_Source.open(p) for p in config["visible"]]
    devices = [_Source.open(p, device=True) for p in DEVICES if os.path.exists(p)]
    _become_inside_user(root_outside)
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    # The new root is mounted over /tmp, a directory every uid may search, in this mount
    # namespace only: the machine's /tmp is untouched and the sources are already open.
    root = "/tmp"
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for source in sources:
        _show(libc, source, root, read_only=True)
    for device in devices:
        _show(libc, device, root, read_only=False)
    os.mkdir(root + "/work")
    _mount(libc, "tmpfs", root + "/work", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={config['disk_mb']}m,mode=0755")
    os.symlink("/work", root + "/tmp")
    os.mkdir(root + "/.old")
    os.chdir(root)
    syscall = PIVOT_ROOT_SYSCALL.get(platform.machine())
    if syscall is None:
        raise OSError(f"pivot_root: unknown syscall number on {platform.machine()}")
    _check(libc.syscall(syscall, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount(libc, None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/work")
    for source in sources + devices:
        if source.fd is not None:
            os.close(source.fd)


def _set_limits(config: dict) -> None:
    def cap(kind: int, value: int) -> None:
        hard = resource.getrlimit(kind)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))

    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_AS, config["memory_mb"] * 2**20)
    cap(resource.RLIMIT_CPU, config["cpu_s"])
    cap(resource.RLIMIT_NPROC, config["max_processes"])
    cap(resource.RLIMIT_FSIZE, config["disk_mb"] * 2**20)
    cap(resource.RLIMIT_NOFILE, 256)


# Runs in the user process (`python -I -S -u -c USER_MAIN`): the code, read from stdin (a pipe
# from init, then /dev/null), as __main__, a final expression printed; an uncaught exception is
# reported on REPORT_FD as "error", or "memory" for MemoryError and ENOMEM.
USER_MAIN = r"""
import ast, errno, os, sys
chunks = []
while chunk := os.read(0, 1 << 16):
    chunks.append(chunk)
code = b"".join(chunks).decode("utf-8")
null = os.open("/dev/null", os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
os.set_inheritable(REPORT_FD, False)
sys.argv = ["-c"]
def report(cause):
    os.write(REPORT_FD, cause.encode())
try:
    tree = ast.parse(code, "<code>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(tree, "<code>", "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<code>", "eval"), scope)
        if value is not None:
            print(repr(value))
except MemoryError:
    os.write(2, b"MemoryError\n")
    report("memory")
    os._exit(1)
except SystemExit:
    raise
except BaseException as exc:
    import traceback
    # From the code's first frame on: not this wrapper's, nor the parser's for a SyntaxError.
    frames = None if isinstance(exc, SyntaxError) else exc.__traceback__.tb_next
    traceback.print_exception(type(exc), exc, frames)
    sys.stderr.flush()
    report("memory" if isinstance(exc, OSError) and exc.errno == errno.ENOMEM else "error")
    os._exit(1)
""".replace("REPORT_FD", str(REPORT_FD))


def _die_with_parent(libc: ctypes.CDLL, parent_pid: int) -> None:
    """SIGKILL when the parent dies (a killed pool worker takes its call along). The kernel
    clears this on every change of credentials, so boot sets it again after its uid switch."""
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if os.getppid() != parent_pid:
        os._exit(1)


def _join_new_session_keyring(libc: ctypes.CDLL) -> None:
    """An empty session keyring of the call's own: the caller's keys stay out of reach."""
    number = KEYCTL_SYSCALL.get(platform.machine())
    if number is None:
        raise OSError(f"keyctl: unknown syscall number on {platform.machine()}")
    if libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        errno = ctypes.get_errno()
        if errno != 38:  # ENOSYS: a kernel without keys has no keyring to inherit
            raise OSError(errno, f"joining a new session keyring: {os.strerror(errno)}")


def _descendants(ancestor: int) -> list[int]:
    """Every live process below `ancestor` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [ancestor]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _kill_descendants() -> None:
    """rlimits: boot is a child subreaper, so whatever the code left running (setsid, double
    forks) is below it; kill and reap until nothing is."""
    while True:
        left = _descendants(os.getpid())
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            if not left:
                return
        time.sleep(0.005)


def _boot(config: dict) -> None:
    libc = _libc()
    _die_with_parent(libc, config["parent_pid"])
    for procs in config["cgroup_procs"]:  # before anything is forked: all of it is counted
        _write(procs, str(os.getpid()))
    _join_new_session_keyring(libc)
    status_fd = config["status_fd"]
    os.set_inheritable(status_fd, False)  # the code's process never gets it (exec closes it)
    os.nice(10)  # a busy call must not starve the caller, which enforces its deadline
    if config["isolation"] == "namespaces":
        _enter_namespaces(libc, config)
        _die_with_parent(libc, config["parent_pid"])
        workdir = "/work"
    else:
        workdir = config["workdir"]
        _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
    _set_limits(config)
    boot_pid = os.getpid()
    init = os.fork()
    if init == 0:
        _init(libc, config, status_fd, workdir, boot_pid)
    os.write(status_fd, f"init {init}\n".encode())
    _, status = os.waitpid(init, 0)
    if config["isolation"] == "rlimits":
        _kill_descendants()
    os._exit(0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 1)


def _start_code(libc: ctypes.CDLL, config: dict, workdir: str, init_pid: int,
                code_read: int, report_write: int, exec_write: int) -> None:
    """The code's process (a child of init): the code on stdin, the report pipe on
    REPORT_FD, the uid it runs as, the seccomp filter, then the interpreter. A failure
    before the interpreter runs is written to `exec_write`, which exec closes (so the code
    cannot write there and pass its own failure off as the sandbox's)."""
    try:
        os.dup2(code_read, 0)
        os.dup2(report_write, REPORT_FD)
        if config["run_as"] is not None:  # rlimits under root: never run the code as root
            os.setgroups([])
            os.setresgid(config["run_as"], config["run_as"], config["run_as"])
            os.setresuid(config["run_as"], config["run_as"], config["run_as"])
        # exec keeps the death signal: the code's process dies with init
        _die_with_parent(libc, init_pid)
        families = (seccomp.AF_UNIX, seccomp.AF_INET, seccomp.AF_INET6) \
            if config["isolation"] == "namespaces" else (seccomp.AF_UNIX,)
        seccomp.install(seccomp.FilterPolicy(socket_families=families, memfd=config["memfd"]))
        os.execve(config["python"], [config["python"], "-I", "-S", "-u", "-c", USER_MAIN],
                  _environment(workdir))
    except BaseException as exc:
        os.write(2, f"sandbox: starting the code failed: {exc}\n".encode())
        os.write(exec_write, b"start")
    finally:
        os._exit(127)


def _init(libc: ctypes.CDLL, config: dict, status_fd: int, workdir: str, boot_pid: int) -> None:
    """Pid 1 of the call (namespaces): start the code, reap orphans, report the code's wait
    status. When init exits, the kernel kills whatever is left in its pid namespace."""
    try:
        # Boot is outside init's pid namespace, where getppid() reads 0.
        _die_with_parent(libc, 0 if config["isolation"] == "namespaces" else boot_pid)
        libc.prctl(PR_SET_DUMPABLE, 0)  # the code may not ptrace or read init's memory
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        init_pid = os.getpid()
        code_read, code_write = os.pipe()
        report_read, report_write = os.pipe()
        exec_read, exec_write = os.pipe()  # close-on-exec: written only if exec never happens
        user = os.fork()
        if user == 0:
            _start_code(libc, config, workdir, init_pid, code_read, report_write, exec_write)
        os.close(code_read)
        os.close(report_write)
        os.close(exec_write)
        try:
            with os.fdopen(code_write, "wb") as pipe:
                pipe.write(config["code"].encode("utf-8"))
        except BrokenPipeError:  # the code's process is already gone; its status says why
            pass
        while True:
            pid, status, usage = os.wait4(-1, 0)
            if pid == user:
                break
        os.set_blocking(report_read, False)
        try:  # written before the code's process exits; a child of it may hold the pipe open
            claim = os.read(report_read, 16).decode(errors="replace")
        except BlockingIOError:
            claim = ""
        claim = claim if claim in ("error", "memory") else "-"
        if os.read(exec_read, 16) == b"start":  # EOF at once when exec happened
            claim = "start"
        cpu_s = usage.ru_utime + usage.ru_stime
        os.write(status_fd, f"exit {status} {cpu_s:.3f} {claim}\n".encode())
    except BaseException as exc:  # no report: the caller counts the call as crashed
        os.write(2, f"sandbox: init failed: {exc}\n".encode())
    finally:
        os._exit(0)


if __name__ == "__main__":
    _config = json.loads(sys.stdin.buffer.read())
    _null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(_null, 0)
    os.close(_null)
    _boot(_config)
