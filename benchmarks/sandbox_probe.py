"""Hostile-code probe of the `python` tool's sandbox, through the shipped API.

Runs 57 small programs as the model's code (`ToolRunner`, `python` tool: deadline 5 s,
memory_mb 128, 4000 bytes of output; the sandbox's disk_mb 64), each trying to get past a
promise of rlscale/runtime/sandbox.py: files, processes, persistence, network, memory,
keyring, kernel calls, output, CPU, exit causes, code size. Its check says `held` or `BREACH`
from the call's result and from the host: the growth of /proc/meminfo Shmem sampled during
the call (and what is left after it), the most marked processes alive at once. Anything that
reaches the host is a breach whatever the payload: a file made outside the sandbox, a hit on
the host's listeners (TCP and UDP on 127.0.0.1, an abstract AF_UNIX socket), a process left
alive after the call (found by a marker in /proc/*/cmdline, then killed), the host's
`nobody` process killed, a key in the host's /proc/keys.

Prints the machine facts, a Markdown table and `breaches: N of M`; exits 1 on any breach.
x86_64 only (syscall numbers). From the repository root:

    .venv/bin/python benchmarks/sandbox_probe.py
"""

from __future__ import annotations

import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlscale.rlvr.tools import ToolCall, ToolResult, ToolRunner, ToolsConfig
from rlscale.runtime import sandbox, sandbox_boot
from rlscale.runtime.cgroups import CallGroup

MARK = f"rlscale-probe-{uuid.uuid4().hex[:12]}"  # argv of left processes, names of made files
SECRET = f"secret-{uuid.uuid4().hex}"  # in a host file and in the caller's environment
DEADLINE_S, MEMORY_MB, MAX_OUTPUT, MAX_PROCESSES = 5.0, 128, 4000, 16
DISK_MB = sandbox.SandboxLimits().disk_mb
CAP_MB = MEMORY_MB + DISK_MB + 32  # the most host Shmem a call may grow by
PREFIX = os.path.realpath(sys.base_prefix)  # the Python installation: visible, read-only
SITE = f"{PREFIX}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
REPO = Path(__file__).resolve().parents[1]  # the project, and ../shared beside it
SHARED = REPO.parent / "shared"
INSIDE = sandbox_boot.WORKDIR  # the code's own writable folder inside the sandbox
# Host folders a payload may try to leave a file in (each checked after every call).
OUTSIDE = ("/", "/tmp", "/var/tmp", "/dev/shm", "/etc", "/usr", "/root", str(REPO.parent),
           str(REPO), str(SHARED), SITE)


@dataclass
class Observed:
    """What the host saw of one call."""

    shmem_mb: float = 0.0       # peak growth of the host's Shmem during the call
    shmem_left_mb: float = 0.0  # its growth still there after the call
    marked_peak: int = 0        # most marked processes alive at once during the call
    evidence: list[str] = field(default_factory=list)  # what reached the host: a breach


Check = Callable[[ToolResult, Observed], tuple[bool, str]]  # (held, note; "": the output)


@dataclass(frozen=True)
class Probe:
    name: str
    cls: str
    code: str
    check: Check


# ------------------------------------------------------------------------------ the host

def meminfo_mb(key: str) -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))


def marked_pids() -> list[int]:
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if MARK.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            pass
    return pids


def made_files() -> list[str]:
    """Files named with MARK outside the sandbox (removed once found), the canary aside."""
    found = []
    for directory in filter(os.path.isdir, OUTSIDE):
        for name in os.listdir(directory):
            if MARK in name and not name.endswith("-canary"):
                found.append(os.path.join(directory, name))
                os.unlink(found[-1])
    return found


def listener(family: int, kind: int, address: object) -> socket.socket:
    s = socket.socket(family, kind)
    s.bind(address)
    if kind == socket.SOCK_STREAM:
        s.listen(8)
    s.setblocking(False)
    return s


class Host:
    """What a payload may try to reach on the machine, and what comes back to it."""

    def __init__(self) -> None:
        self.tcp = listener(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0))
        self.udp = listener(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0))
        self.unix = listener(socket.AF_UNIX, socket.SOCK_STREAM, "\0" + MARK)
        self.canary_file = f"/tmp/{MARK}-canary"
        with open(self.canary_file, "w") as f:
            f.write(SECRET)
        self.nobody = subprocess.Popen(["sleep", "3600"], user=65534)  # as the code, outside

    def evidence(self) -> list[str]:
        """Everything that reached the host since the last look (cleaned up)."""
        pids = marked_pids()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        found = [f"process {pid} alive after the call" for pid in pids]
        for name, s in (("TCP", self.tcp), ("AF_UNIX", self.unix), ("UDP", self.udp)):
            hits = 0
            try:
                while True:  # every connection or datagram since the last look
                    s.recv(64) if s is self.udp else s.accept()[0].close()
                    hits += 1
            except BlockingIOError:
                pass
            found += [f"host {name} listener reached {hits}x"] * bool(hits)
        found += [f"made {path}" for path in made_files()]
        if self.nobody.poll() is not None:
            found.append(f"host nobody process killed ({self.nobody.returncode})")
            self.nobody = subprocess.Popen(["sleep", "3600"], user=65534)
        with open("/proc/keys") as f:
            found += ["key in the host's /proc/keys"] * (MARK in f.read())
        return found

    def close(self) -> None:
        self.nobody.kill()
        self.nobody.wait()
        for s in (self.tcp, self.udp, self.unix):
            s.close()
        os.unlink(self.canary_file)


class Sampler(threading.Thread):
    """Host Shmem every 20 ms and marked processes every 100 ms, during one call."""

    def __init__(self, observed: Observed) -> None:
        super().__init__(daemon=True)
        self.observed, self.base, self.done = observed, meminfo_mb("Shmem"), threading.Event()

    def run(self) -> None:
        tick, o = 0, self.observed
        while not self.done.wait(0.02):
            o.shmem_mb = max(o.shmem_mb, meminfo_mb("Shmem") - self.base)
            tick += 1
            if tick % 5 == 0:
                o.marked_peak = max(o.marked_peak, len(marked_pids()))


# ----------------------------------------------------------------------------- checks

def no_got(*needles: str, got: str | None = "GOT") -> Check:
    """Held when the payload ran to its end, got nothing (no `got` line; None: may) and
    leaked no needle."""
    def check(r: ToolResult, o: Observed) -> tuple[bool, str]:
        leaked = any(n in r.text for n in needles)
        held = r.ok and not leaked and (got is None or got not in r.text)
        return held, "a host secret leaked" * leaked
    return check


def refused(r: ToolResult, o: Observed) -> tuple[bool, str]:
    """Held when the call failed in the sandbox: a negative rc, or the process killed."""
    rc = re.search(r"^rc (-?\d+)", r.text, re.M)
    return (r.cause == "crashed" if rc is None else int(rc.group(1)) < 0), ""


def cause_is(*causes: str, text: str | None = None) -> Check:
    def check(r: ToolResult, o: Observed) -> tuple[bool, str]:
        held = r.cause in causes and r.seconds <= DEADLINE_S + 1.5 and text in (None, r.text)
        return held, f"{r.seconds:.1f}s: {r.text}"
    return check


def memory(expect: str | None = None, most: tuple[str, int] | None = None) -> Check:
    """Held when the call failed (with `expect`), host Shmem grew by at most CAP_MB and kept
    at most 32 MB, and the number the payload printed for `most` (pattern, limit) is within;
    no number printed: held only if the call ran out of memory."""
    def check(r: ToolResult, o: Observed) -> tuple[bool, str]:
        held = r.cause == (expect or r.cause) and o.shmem_mb <= CAP_MB and o.shmem_left_mb <= 32
        if most is not None:
            m = re.search(most[0], r.text)
            held = held and (int(m.group(1)) <= most[1] if m else r.cause == "memory")
        else:
            held = held and not r.ok
        return held, f"Shmem +{o.shmem_mb:.0f} MB (left {max(o.shmem_left_mb, 0):.0f}); {r.text}"
    return check


def fork_bomb(r: ToolResult, o: Observed) -> tuple[bool, str]:
    return not r.ok and o.marked_peak <= MAX_PROCESSES, f"{o.marked_peak} processes at most"


def anything(r: ToolResult, o: Observed) -> tuple[bool, str]:
    return True, ""  # the host's evidence alone decides


# ---------------------------------------------------------------------------- payloads

def attempts(*statements: str, prelude: str = "import os\n") -> str:
    """Try each statement; print GOT and a piece of the value when one works."""
    return prelude + "\n".join(f"try: data = {s}\nexcept (OSError, ValueError) as e: "
                               f"print('denied', getattr(e, 'errno', e))\n"
                               f"else: print('GOT', repr(data)[:120])" for s in statements)


def syscall(nr: int, args: str, prelude: str = "") -> str:
    return ("import ctypes, os, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n" + prelude
            + f"rc = libc.syscall({nr}, {args})\nprint('rc', rc, 'errno', ctypes.get_errno())")


def sock(family: int, kind: int = socket.SOCK_STREAM) -> str:
    return (f"import socket\ntry: print('rc', socket.socket({family}, {kind}).fileno())\n"
            "except OSError as e: print('rc -1 errno', e.errno)")


def marked(inner: str) -> str:
    """A statement: become `python -c inner MARK`, findable on the host by MARK."""
    return f"os.execv(sys.executable, [sys.executable, '-c', {inner!r}, {MARK!r}])"


SLEEP = "import time; time.sleep(60)"
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
BOMB = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"
FLOOD = "import os\nwhile True: os.write(1, b'x' * 65536)"
INT80 = r"""import ctypes, mmap, struct
page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40, prot=7)
base = ctypes.addressof(ctypes.c_char.from_buffer(page))  # MAP_32BIT: int 0x80 reads 32 bits
page[64:76] = struct.pack('<III', 16, 3, 0)  # socket(AF_NETLINK, SOCK_RAW, 0)
code = b'\x53\xb8\x66\0\0\0\xbb\x01\0\0\0\xb9' + struct.pack('<I', base + 64) + b'\xcd\x80\x5b\xc3'
page[:len(code)] = code  # push rbx; socketcall(SYS_SOCKET, args) by int 0x80; pop rbx; ret
print('rc', ctypes.CFUNCTYPE(ctypes.c_int)(base)())"""
SYSV = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0, ctypes.c_size_t(1 << 30), 0o1600)
if shm < 0: raise OSError(ctypes.get_errno(), 'shmget')
ctypes.memset(libc.shmat(shm, None, 0), 1, 1 << 30)"""
SHARED_KIDS = """import mmap, os, time
for _ in range(12):
    if os.fork() == 0:
        m = mmap.mmap(-1, 100 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        for i in range(0, 100 << 20, 4096): m[i] = 1
        time.sleep(2); os._exit(0)
print('children', [os.wait()[1] for _ in range(12)])"""
FILL = f"""written = 0
try:
    for n in range(1024):
        with open(f'{INSIDE}/fill{{n // 32}}', 'ab') as f: f.write(b'x' * (1 << 20))
        written += 1
except OSError as e: raise OSError(e.errno, f'wrote {{written}} MB') from None"""
PIPES = """import fcntl, os, time
def fill(held=0):
    try:
        while True:
            r, w = os.pipe(); os.set_blocking(w, False)
            try: fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
            except OSError: pass
            try:
                while True: held += os.write(w, bytes(65536))
            except BlockingIOError: pass
    except OSError: return held
rd, wr = os.pipe()
for _ in range(12):
    if os.fork() == 0: os.write(wr, b'%d\\n' % fill()); time.sleep(2); os._exit(0)
os.close(wr)
print('pipes MB', sum(map(int, os.fdopen(rd).read().split())) >> 20)"""


def probes(host: Host) -> list[Probe]:
    with open("/etc/shadow") as f:
        shadow = f.readline().strip()
    root_names = [f"'{n}'" for n in os.listdir("/root") if n != ".pyenv"]
    port, udp, made = host.tcp.getsockname()[1], host.udp.getsockname()[1], f"made-{MARK}"
    P, R = Probe, refused
    return [
        P("read /etc/shadow, /etc/passwd", "files", attempts(
            "open('/etc/shadow').read()", "open('/etc/passwd').read()"), no_got(shadow, "root:x")),
        P("list /root (.pyenv is shown)", "files", attempts("sorted(os.listdir('/root'))"),
          no_got(*root_names, got=None)),
        P("read the project", "files", attempts(
            f"os.listdir('{REPO}')", f"open('{REPO / 'pyproject.toml'}').read()"), no_got()),
        P("list ../shared", "files", attempts(
            "os.listdir('../shared')", f"os.listdir('{SHARED}')"), no_got()),
        P("read the host's /tmp canary", "files", attempts(f"open({host.canary_file!r}).read()"),
          no_got(SECRET)),
        P("symlink to /etc/passwd", "files", attempts(f"open('{INSIDE}/l').read()", prelude=(
            f"import os\nos.symlink('/etc/passwd', '{INSIDE}/l')\n")), no_got("root:x")),
        P(f".. out of a bind mount, {INSIDE}", "files", attempts(
            f"open('{PREFIX}/../../../.bashrc').read()", "open('/usr/../etc/passwd').read()",
            f"open('{INSIDE}/../../../etc/hostname').read()"), no_got()),
        P("/proc/1/root, /proc/self/mounts, /sys", "files", attempts(
            "os.listdir('/proc/1/root')", "open('/proc/self/mountinfo').read()",
            "os.listdir('/sys/fs/cgroup')"), no_got("/dev/vda")),
        P(f"write outside {INSIDE}", "files", attempts(*(
            f"open('{d}/{made}', 'w').write('x')" for d in ("", "/etc", "/usr", "/dev", "/root",
                                                            SITE))), no_got()),
        P("inherited directory fds", "files", "import os\nfor fd in range(3, 256):\n"
          "    try: print('GOT', fd, os.listdir(fd))\n    except OSError: pass", no_got()),
        P("fork bomb (exec'd, marked)", "processes", "import os, sys\nwhile True:\n    try:\n"
          f"        if os.fork() == 0: {marked(BOMB)}\n    except OSError: pass", fork_bomb),
        P("setsid + double fork survivor", "processes", "import os, sys\nif os.fork() == 0:\n"
          f"    os.setsid()\n    if os.fork() == 0: {marked(SLEEP)}\n    os._exit(0)\n"
          "os.wait()\nprint('left a daemon')", anything),
        P("ignore SIGTERM, hang", "processes", "import os, signal, sys, time\n"
          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nfor _ in range(3):\n"
          f"    if os.fork() == 0: {marked(DEAF)}\ntime.sleep(60)", cause_is("timeout")),
        P("ptrace attach the parent", "processes", syscall(101, "16, os.getppid(), 0, 0"), R),
        P("kill(-1), kill a host pid", "processes", attempts(
            "os.kill(-1, 9)", f"os.kill({host.nobody.pid}, 9)"), anything),
        P("raise rlimits, setuid(0), nice -5", "processes", attempts(
            "resource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "os.setuid(0)", "os.nice(-5)",
            "resource.setrlimit(resource.RLIMIT_NPROC, (-1, -1))",
            prelude="import os, resource\n"), no_got()),
        P("leave files and env for the next call", "persistence", "import os\n"
          f"for p in ('/tmp/{made}', '{INSIDE}/{made}', os.path.expanduser('~/{made}')):\n"
          "    open(p, 'w').write('x')\nos.environ['PROBE'] = 'x'\nos.putenv('PROBE2', 'x')\n"
          "print('left')", cause_is("ok")),
        P("find them in the next call", "persistence", "import glob, os\nfound = "
          f"glob.glob('/tmp/*{MARK}*') + glob.glob('{INSIDE}/*{MARK}*') + "
          "[k for k in os.environ if k.startswith('PROBE')]\nprint('GOT' if found else 'none')",
          no_got()),
        P("the caller's environment", "persistence", "import os\nprint(sorted(os.environ))",
          no_got(SECRET, "RLSCALE_PROBE", "VIRTUAL_ENV")),
        P("TCP, TCP6 to host 127.0.0.1", "network", attempts(*(
            f"socket.create_connection(('{a}', {port}), 2)" for a in ("127.0.0.1", "::ffff:7f00:1")
        ), prelude="import socket\n"), no_got()),
        P("UDP to host 127.0.0.1", "network", attempts(f"socket.socket(2, 2).sendto(b'{MARK}', "
          f"('127.0.0.1', {udp}))", prelude="import socket\n"), anything),
        P("TCP to 1.1.1.1:443, DNS", "network", attempts(
            "socket.create_connection(('1.1.1.1', 443), 2)",
            "socket.getaddrinfo('example.com', 80)", prelude="import socket\n"), no_got()),
        P("abstract AF_UNIX on the host", "network", attempts(
            f"socket.socket(1, 1).connect('\\0{MARK}')", prelude="import socket\n"), no_got()),
        P("AF_VSOCK (40)", "network", sock(40), R),
        P("AF_NETLINK (16)", "network", sock(16, socket.SOCK_RAW), R),
        P("AF_PACKET (17)", "network", sock(17, socket.SOCK_RAW), R),
        P("AF_ALG (38)", "network", sock(38, socket.SOCK_SEQPACKET), R),
        P("every other family 0..45", "network", "import socket\nmade = []\n"
          "for family in set(range(46)) - {1, 2, 10}:\n    for kind in (1, 2, 3, 5):\n"
          "        try: socket.socket(family, kind).close(); made.append((family, kind))\n"
          "        except OSError: pass\nprint('GOT' if made else 'none', made)", no_got()),
        P("socketpair AF_UNIX (allowed)", "network", "import socket\na, b = socket.socketpair()"
          "\na.send(b'hi')\nprint('pair', b.recv(2))", cause_is("ok", text="pair b'hi'")),
        P("x32 socket(AF_NETLINK)", "network", syscall(0x40000000 | 41, "16, 3, 0"), R),
        P("int 0x80 socketcall(AF_NETLINK)", "network", INT80, R),
        P("bytearray 30 GB", "memory", "b = bytearray(30 << 30)", memory("memory")),
        P("memfd_create 1 GiB over 16 fds", "memory", "import os\nfor i in range(16):\n"
          "    fd = os.memfd_create(f'm{i}')\n    for _ in range(64): os.write(fd, bytes(1 << 20))",
          memory("memory")),
        P("SysV shmget + shmat 1 GiB", "memory", SYSV, memory()),
        P("mmap MAP_SHARED anon 1 GiB", "memory", "import mmap\nm = mmap.mmap(-1, 1 << 30, "
          "flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\nfor i in range(0, 1 << 30, 4096): "
          "m[i] = 1", memory("memory")),
        P("12 children x 100 MB MAP_SHARED", "memory", SHARED_KIDS, memory("memory")),
        P(f"fill tmpfs {INSIDE} to 1 GiB", "memory", FILL, memory(most=(r"wrote (\d+) MB", DISK_MB))),
        P("12 children x pipes F_SETPIPE_SZ", "memory", PIPES,
          memory(most=(r"pipes MB (\d+)", CAP_MB))),
        P("keyctl read session keyring", "keyring", syscall(
            250, "11, -3, buf, 4096", "buf = ctypes.create_string_buffer(4096)\n"), R),
        P("keyctl search session keyring", "keyring",
          syscall(250, "10, -3, b'user', b'rlscale', 0"), R),
        P("add_key to session keyring", "keyring",
          syscall(248, f"b'user', b'{MARK}', b'x', 1, -3"), R),
        P("request_key", "keyring", syscall(249, "b'user', b'rlscale', None, -3"), R),
        P("bpf map create (321)", "kernel", syscall(321, "0, attr, 72", "attr = ctypes."
          "create_string_buffer(struct.pack('IIII', 2, 4, 4, 1), 72)\n"), R),
        P("perf_event_open (298)", "kernel", syscall(298, "attr, 0, -1, -1, 0", "attr = ctypes."
          "create_string_buffer(struct.pack('IIQQQQQ', 1, 128, 0, 0, 0, 0, 97), 128)\n"), R),
        P("userfaultfd user-mode (323)", "kernel", syscall(323, "1 | os.O_CLOEXEC"), R),
        P("io_uring_setup (425)", "kernel", syscall(
            425, "8, params", "params = ctypes.create_string_buffer(120)\n"), R),
        P("unshare CLONE_NEWUSER (272)", "kernel", syscall(272, "0x10000000"), R),
        P("mount tmpfs (165)", "kernel", syscall(165, f"b'none', b'{INSIDE}', b'tmpfs', 0, None"), R),
        P("clone3 CLONE_NEWUSER (435)", "kernel", syscall(435, "args, 88", "args = ctypes."
          "create_string_buffer(struct.pack('8Q', 0x10000000, 0, 0, 0, 17, 0, 0, 0), 88)\n"), R),
        P("mknod /dev/mem (133)", "kernel", syscall(133, f"b'{INSIDE}/mem', 0o20600, 0x101"), R),
        P("1 GB of output", "output", "import sys\nfor _ in range(1 << 14): "
          "sys.stdout.write('x' * 65536)", cause_is("output_limit")),
        P("flood from an orphan", "output", "import os, sys\nif os.fork() == 0: "
          f"{marked(FLOOD)}\nprint('parent done')", cause_is("ok", "output_limit")),
        P("infinite loop", "CPU", "while True: pass", cause_is("timeout")),
        P("self-sent SIGXCPU (not timeout)", "CPU", "import os, signal\n"
          "os.kill(os.getpid(), signal.SIGXCPU)", cause_is("crashed")),
        P("os._exit(86)", "exit", "import os\nos._exit(86)", cause_is("exit")),
        P("os._exit(86) after 100 MB", "exit", "import os\nb = bytearray(100 << 20)\n"
          "os._exit(86)", cause_is("exit")),
        P("70,000 newlines", "code", "\n" * 70_000 + "print('ran')", cause_is("ok", text="ran")),
    ]


# ------------------------------------------------------------------------------- run it

def run_probe(runner: ToolRunner, host: Host, probe: Probe) -> tuple[ToolResult, Observed]:
    observed = Observed()
    sampler = Sampler(observed)
    sampler.start()
    try:
        result, = runner.run([ToolCall(None, probe.code)])
    finally:
        sampler.done.set()
        sampler.join()
    time.sleep(0.3)  # what the call left behind has had time to show
    observed.shmem_left_mb = meminfo_mb("Shmem") - sampler.base
    observed.evidence = host.evidence()
    return result, observed


def facts() -> str:
    group = CallGroup.create((MEMORY_MB + DISK_MB) << 20, MAX_PROCESSES)
    if group is not None:
        group.remove()
    return (f"machine: kernel {platform.release()} {platform.machine()}, uid {os.getuid()}, "
            f"memory cgroup: {f'yes (v{group.version})' if group else 'no'}, "
            f"namespaces: {sandbox.probe() or 'available'}")


def cell(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return (text[:limit - 3] + "..." if len(text) > limit else text).replace("|", "\\|")


def main() -> int:
    if platform.machine() != "x86_64":
        print("sandbox_probe: x86_64 only (syscall numbers)")
        return 2
    os.environ["RLSCALE_PROBE_SECRET"] = SECRET  # the caller's environment: must not leak
    print(facts(), flush=True)
    runner = ToolRunner.from_config(ToolsConfig(
        tools=["python"], deadline_s=DEADLINE_S, memory_mb=MEMORY_MB,
        max_output_chars=MAX_OUTPUT, max_processes=MAX_PROCESSES))
    host = Host()
    breaches = total = 0
    print("\n| # | class | payload | cause | verdict | note |\n|---|---|---|---|---|---|")
    try:
        for total, probe in enumerate(probes(host), 1):
            result, observed = run_probe(runner, host, probe)
            held, note = probe.check(result, observed)
            if observed.evidence:
                held, note = False, "; ".join(observed.evidence)
            breaches += not held
            print(f"| {total} | {probe.cls} | {probe.name} | {result.cause} | "
                  f"{'held' if held else 'BREACH'} | {cell(note or result.text)} |", flush=True)
    finally:
        runner.close()
        host.close()
    print(f"\nbreaches: {breaches} of {total}")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
