"""A control group per sandboxed call: a memory cap that counts every page the call holds
(anonymous memory, page cache, tmpfs and memfd files, SysV segments, kernel memory charged to
it) and a cap on its processes, made beside the caller's own group and removed after the call.

RLIMIT_AS bounds what a process maps, not what it holds: pages written to a memfd or a tmpfs
file without a mapping are outside it. The memory controller charges them to the group of the
process that wrote them. cgroup v2 where the caller's group lets us add a child with the
memory and pids controllers (delegated, or root with the controllers enabled), else cgroup v1
(the `memory` and `pids` hierarchies, writable by root). `CallGroup.create` returns None where
neither can be made; the sandbox then refuses the calls that would hold memory outside
RLIMIT_AS (runtime/seccomp.py).

The group's `oom_kill` count tells the caller that the call ran out of memory, whatever the
kernel killed and whatever the code printed. This module imports only the standard library.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, fstype, super options) of every cgroup mount."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, (fstype, _, options) = left.split(), right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                mounts.append((fields[3], fields[4], fstype, options))
    return mounts


def _own_groups() -> dict[str, str]:
    """controller (or '' for v2) -> this process's group path, from /proc/self/cgroup."""
    groups = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                groups[controller] = path
    return groups


def _directory(mount_root: str, mount_point: str, path: str) -> str | None:
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
        return None
    relative = path[len(mount_root):] if mount_root != "/" else path
    directory = os.path.normpath(mount_point + "/" + relative.lstrip("/"))
    return directory if os.path.isdir(directory) else None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _v1_pids_group(directory: str | None, max_processes: int) -> str | None:
    """The call's group in the v1 pids hierarchy, capped at `max_processes`; None where it
    cannot be made (the memory cap holds without it)."""
    if directory is None:
        return None
    try:
        os.mkdir(directory)
    except OSError:
        return None
    try:
        _write(f"{directory}/pids.max", str(max_processes))
    except OSError:
        os.rmdir(directory)
        return None
    return directory


@dataclass(frozen=True, slots=True)
class CallGroup:
    version: int                 # 2 or 1
    memory_dir: str              # the call's memory group (v2: its only group)
    pids_dir: str | None         # v1: the call's group in the pids hierarchy, if made
    memory_bytes: int

    @classmethod
    def create(cls, memory_bytes: int, max_processes: int) -> CallGroup | None:
        """A new group capped at `memory_bytes` (no swap) and `max_processes`, or None where
        this process may not make one."""
        name = f"rlscale-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        mounts, own = _mounts(), _own_groups()
        for root, point, fstype, _ in mounts:
            if fstype == "cgroup2" and "" in own:
                group = cls._v2(root, point, own[""], name, memory_bytes, max_processes)
                if group is not None:
                    return group
        return cls._v1(mounts, own, name, memory_bytes, max_processes)

    @classmethod
    def _v2(cls, root: str, point: str, path: str, name: str, memory_bytes: int,
            max_processes: int) -> CallGroup | None:
        parent = _directory(root, point, path)
        if parent is None:
            return None
        try:
            if not {"memory", "pids"} <= set(_read(f"{parent}/cgroup.subtree_control").split()):
                _write(f"{parent}/cgroup.subtree_control", "+memory +pids")
            directory = f"{parent}/{name}"
            os.mkdir(directory)
        except OSError:  # not delegated, or processes in the parent ("no internal processes")
            return None
        group = cls(2, directory, None, memory_bytes)
        try:
            _write(f"{directory}/memory.max", str(memory_bytes))
            if os.path.exists(f"{directory}/memory.swap.max"):
                _write(f"{directory}/memory.swap.max", "0")
            _write(f"{directory}/pids.max", str(max_processes))
        except OSError:
            group.remove()
            return None
        return group

    @classmethod
    def _v1(cls, mounts: list, own: dict[str, str], name: str, memory_bytes: int,
            max_processes: int) -> CallGroup | None:
        directories: dict[str, str] = {}
        for root, point, fstype, options in mounts:
            for controller in ("memory", "pids"):
                if fstype == "cgroup" and controller in options.split(",") and controller in own:
                    parent = _directory(root, point, own[controller])
                    if parent is not None:
                        directories[controller] = f"{parent}/{name}"
        if "memory" not in directories:
            return None
        try:
            os.mkdir(directories["memory"])
        except OSError:
            return None
        pids_dir = _v1_pids_group(directories.get("pids"), max_processes)
        group = cls(1, directories["memory"], pids_dir, memory_bytes)
        try:
            _write(f"{group.memory_dir}/memory.limit_in_bytes", str(memory_bytes))
            memsw = f"{group.memory_dir}/memory.memsw.limit_in_bytes"
            if os.path.exists(memsw):
                _write(memsw, str(memory_bytes))
        except OSError:
            group.remove()
            return None
        return group

    @property
    def procs_files(self) -> list[str]:
        """What a process writes its pid to, to join the group (all its hierarchies)."""
        dirs = [self.memory_dir] + ([self.pids_dir] if self.pids_dir else [])
        return [f"{d}/cgroup.procs" for d in dirs]

    def oom_kills(self) -> int:
        """Processes the kernel killed for the group's memory cap."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in _read(f"{self.memory_dir}/{name}").splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def peak_bytes(self) -> int | None:
        """The most memory the group held (None where the kernel does not say)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int(_read(f"{self.memory_dir}/{name}"))
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        """Remove the group; its processes must be gone (a v1 group's page cache is moved to
        the parent by the kernel)."""
        for directory in (self.memory_dir, self.pids_dir):
            if directory is None:
                continue
            for _ in range(200):  # a killed process may take a moment to leave the group
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
