"""A seccomp filter for the python sandbox's code: the system calls a tool never needs are
refused (an errno, the process lives on), through Debian's libseccomp (`libseccomp2`) over
ctypes.

Why libseccomp and not a hand-built BPF program: it resolves syscall names per
architecture, checks the audit arch (a filter built for x86_64 kills any i386 `int 0x80`
syscall, so `socketcall` cannot go around the `socket` rules) and compiles argument
comparisons correctly; it is a well-kept system library on every Debian/Ubuntu. Why not a
PyPI binding: the sandbox's boot program runs under `python -I -S`, with the standard
library only, and the bindings on the registry (pyseccomp) are thin ctypes wrappers of the
same library, unmaintained since 2021.

What `install(policy)` refuses, for the calling process and everything it starts (a filter is
inherited and cannot be removed; `no_new_privs` must be set first):
- `socket`/`socketpair` of every address family but `policy.socket_families` (AF_VSOCK,
  AF_NETLINK, AF_PACKET, AF_ALG, ... reach past a network namespace);
- the kernel keyring (`keyctl`, `add_key`, `request_key`);
- SysV shared memory and message queues (pages outside RLIMIT_AS) and, unless
  `policy.memfd` (a memory cgroup bounds the call), `memfd_create`: ENOMEM;
- what a tool never needs and an attacker wants: ptrace and other processes' memory, bpf,
  perf events, userfaultfd, io_uring (its operations bypass seccomp), mounts and namespaces
  (also `clone` with a namespace flag; `clone3`, whose flags seccomp cannot read, is ENOSYS
  so that libc falls back to `clone`), modules, kexec, swap, reboot, quotas, the kernel log.

This module imports only the standard library: the sandbox's boot program loads it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
from dataclasses import dataclass

AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ, SCMP_CMP_GT, SCMP_CMP_MASKED_EQ = 4, 6, 7
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                         0x20000000, 0x40000000)  # NEWNS, NEWCGROUP, UTS, IPC, USER, PID, NET

REFUSED = (
    "keyctl", "add_key", "request_key",
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "unshare", "setns", "chroot",
    "name_to_handle_at", "open_by_handle_at",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog", "vhangup", "iopl", "ioperm",
    "lookup_dcookie", "personality",
)
OUTSIDE_RLIMIT_AS = ("shmget", "msgget")  # SysV segments and queues: ENOMEM


class SeccompError(OSError):
    """libseccomp is missing or refused the filter (one line)."""


@dataclass(frozen=True, slots=True)
class FilterPolicy:
    socket_families: tuple[int, ...] = (AF_UNIX,)
    memfd: bool = False  # allow memfd_create (only where a memory cgroup counts its pages)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


_library: list[ctypes.CDLL] = []


def library() -> ctypes.CDLL:
    """libseccomp, loaded once; SeccompError names the package when it is missing."""
    if not _library:
        name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError:
            raise SeccompError("libseccomp is not installed (Debian/Ubuntu: apt-get install "
                               "libseccomp2); the sandbox needs it for its seccomp filter") from None
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        lib.seccomp_load.argtypes = [ctypes.c_void_p]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                               ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
        _library.append(lib)
    return _library[0]


def available() -> str | None:
    """None when a filter can be built here, else why not (one line)."""
    try:
        library()
    except SeccompError as exc:
        return str(exc)
    return None


def _rule(lib: ctypes.CDLL, ctx: int, action: int, name: str,
          *comparisons: tuple[int, int, int, int]) -> None:
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number < 0:  # not a syscall of this architecture (e.g. iopl on aarch64)
        return
    array = (_ArgCmp * max(len(comparisons), 1))(*[_ArgCmp(*c) for c in comparisons])
    result = lib.seccomp_rule_add_array(ctx, action, number, len(comparisons), array)
    if result < 0:
        raise SeccompError(f"seccomp rule for {name}: {errno.errorcode.get(-result, result)}")


def _socket_rules(lib: ctypes.CDLL, ctx: int, families: tuple[int, ...]) -> None:
    """Refuse every family but `families`: libseccomp ANDs the comparisons of one rule and
    allows one per argument, so the complement is written as single values and one range."""
    refuse = _errno_action(errno.EAFNOSUPPORT)
    top = max(families)
    for name in ("socket", "socketpair"):
        for family in range(top):
            if family not in families:
                _rule(lib, ctx, refuse, name, (0, SCMP_CMP_EQ, family, 0))
        _rule(lib, ctx, refuse, name, (0, SCMP_CMP_GT, top, 0))


def install(policy: FilterPolicy) -> None:
    """Load the filter into this process (inherited by its children and kept across exec).
    Needs PR_SET_NO_NEW_PRIVS (or CAP_SYS_ADMIN)."""
    lib = library()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompError("seccomp_init failed")
    try:
        refuse = _errno_action(errno.EPERM)
        for name in REFUSED:
            _rule(lib, ctx, refuse, name)
        no_memory = _errno_action(errno.ENOMEM)
        for name in OUTSIDE_RLIMIT_AS + (() if policy.memfd else ("memfd_create", "memfd_secret")):
            _rule(lib, ctx, no_memory, name)
        for flag in CLONE_NAMESPACE_FLAGS:
            _rule(lib, ctx, refuse, "clone", (0, SCMP_CMP_MASKED_EQ, flag, flag))
        _rule(lib, ctx, _errno_action(errno.ENOSYS), "clone3")
        _socket_rules(lib, ctx, policy.socket_families)
        result = lib.seccomp_load(ctx)
        if result < 0:
            raise SeccompError(f"seccomp_load: {errno.errorcode.get(-result, result)}")
    finally:
        lib.seccomp_release(ctx)
