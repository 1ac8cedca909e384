"""Built-in tasks and the registry `make_task(name, **kwargs)`."""

from __future__ import annotations

from typing import Any

from .arithmetic import ArithmeticTask
from .base import Example, Task, examples, split_of
from .countdown import CountdownTask

TASKS: dict[str, type] = {"arithmetic": ArithmeticTask, "countdown": CountdownTask}


class UnknownTaskError(ValueError):
    pass


def make_task(name: str, **kwargs: Any) -> Task:
    if name not in TASKS:
        raise UnknownTaskError(f"unknown task '{name}' (known: {', '.join(sorted(TASKS))})")
    try:
        return TASKS[name](**kwargs)
    except TypeError as exc:
        raise UnknownTaskError(f"bad options for task '{name}': {exc}") from None


__all__ = ["Example", "Task", "TASKS", "make_task", "examples", "split_of",
           "ArithmeticTask", "CountdownTask", "UnknownTaskError"]
