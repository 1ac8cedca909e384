"""The sandbox's boot program (`python -I -S sandbox_boot.py`, its config on stdin): limits,
namespaces, a new root, then init (pid 1 of the call) which starts the code's process under
the seccomp filter and reports how it ended. rlscale.runtime.sandbox starts it and says what
it contains; this file runs in the child, before and around the untrusted code.

This module imports only the standard library (and its sibling seccomp.py)."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import signal
import sys
import time
from dataclasses import dataclass

if __package__:
    from . import seccomp
else:  # run as the boot program: the filter's module beside it, standard library only
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import seccomp

REPORT_FD = 3          # the code's process reports an uncaught exception here ("error", "memory")
INSIDE_ID = 1000       # the uid and gid the code has inside its user namespace (not root)
NOBODY_ID = 65534      # what root runs the code as, outside (see _map_ids)
WORKDIR = "/work"      # the code's own writable folder (a tmpfs) inside its new root
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


def environment(home: str) -> dict[str, str]:
    # Nothing of the caller's environment: no tokens, no proxies, no PYTHON* variables.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home,
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


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
    os.mkdir(root + WORKDIR)
    _mount(libc, "tmpfs", root + WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={config['disk_mb']}m,mode=0755")
    os.symlink(WORKDIR, root + "/tmp")
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
    os.chdir(WORKDIR)
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
        workdir = WORKDIR
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
                  environment(workdir))
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
