"""Misbehaving callables for the worker-pool tests.

They live in a module of their own (not in a test file) because pool workers are fresh
interpreters: they import what they run by name, with the parent's sys.path (tests/ is on
it under pytest), and should not have to import pytest or a test module to do so.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time

from rlscale.rlvr.tasks import Example


def misbehave(command: str) -> float:
    """Do what `command` says; otherwise return it as a float (so "nan" returns NaN)."""
    if command == "raise":
        raise RuntimeError("boom in verifier")
    if command == "raise-other":
        raise KeyError("other")
    if command == "loop":
        while True:
            pass
    if command == "sleep":
        time.sleep(10)
    if command == "stubborn":
        # a verifier that swallows every Exception (math parsers often do) still stops
        while True:
            try:
                time.sleep(0.05)
            except Exception:
                pass
    if command == "segfault":
        ctypes.string_at(0)
    if command == "exit":
        os._exit(3)
    if command == "kill-self":
        os.kill(os.getpid(), 9)
    if command == "alloc":
        return float(len(bytearray(10 * 2**30)))  # 10 GiB, far past the worker's limit
    if command.startswith("spawn-and-sleep:"):  # a verifier that starts a helper process
        helper = subprocess.Popen(["sleep", "60"])
        with open(command.split(":", 1)[1], "w") as f:
            f.write(str(helper.pid))
        time.sleep(10)
    if command == "pid":
        return float(os.getpid())
    return float(command)


class ScriptedTask:
    """A task whose verifier does what the completion says."""

    name = "scripted"

    def sample(self, split, rng):  # pragma: no cover - unused
        raise NotImplementedError

    def demonstration(self, example, rng):  # pragma: no cover - unused
        raise NotImplementedError

    def verify(self, completion: str, example: Example) -> float:
        return misbehave(completion)


def scripted_reward(completion: str, example: Example) -> float:
    """A user reward function (`verifier_faults:scripted_reward`) that does what it is told."""
    return misbehave(completion)


def length_reward(completion: str, example: Example) -> float:
    return float(len(completion))


def digit_share(completion: str, example: Example) -> float:
    """A dense reward that even a random model's samples vary in: the share of digits."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def always_fails(completion: str, example: Example) -> float:
    """A user reward function that raises on every sample (every one scores 0)."""
    raise RuntimeError("this verifier is broken")
