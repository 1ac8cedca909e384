"""Tasks and the registry `make_task(name, **options)`.

Built-in: `arithmetic`, `countdown`, `long_arithmetic` (reasoning traces). Sources by prefix: `reasoning_gym:<dataset>`,
`jsonl:<path>`, `parquet:<path>`, `hf:<folder>` (a `datasets` folder from `save_to_disk`).
"""

from __future__ import annotations

from typing import Any

from .arithmetic import ArithmeticTask
from .base import ChatMessage, Example, Task, TaskOptionError, examples, split_of
from .countdown import CountdownTask
from .long_arithmetic import LongArithmeticTask

TASKS: dict[str, type] = {"arithmetic": ArithmeticTask, "countdown": CountdownTask,
                          "long_arithmetic": LongArithmeticTask}
SOURCES = ("reasoning_gym", "jsonl", "parquet", "hf")


class UnknownTaskError(ValueError):
    pass


def make_task(name: str, **kwargs: Any) -> Task:
    """The task `name` with its options; a one-line error for an unknown name or option."""
    source, _, target = name.partition(":")
    if target and source in SOURCES:
        return _make_source(source, target, kwargs)
    if name not in TASKS:
        raise UnknownTaskError(f"unknown task '{name}' (known: {', '.join(sorted(TASKS))}, "
                               f"or {', '.join(f'{s}:...' for s in SOURCES)})")
    try:
        return TASKS[name](**kwargs)
    except TypeError as exc:
        raise UnknownTaskError(f"bad options for task '{name}': {exc}") from None


def _make_source(source: str, target: str, options: dict[str, Any]) -> Task:
    if source == "reasoning_gym":
        from .reasoning_gym import ReasoningGymTask

        return ReasoningGymTask(target, **options)
    from .files import DatasetTask

    try:
        return DatasetTask(source, target, **options)
    except TypeError as exc:
        raise UnknownTaskError(f"bad options for task '{source}:{target}': {exc}") from None


__all__ = ["ChatMessage", "Example", "Task", "TASKS", "make_task", "examples", "split_of",
           "ArithmeticTask", "CountdownTask", "LongArithmeticTask", "TaskOptionError", "UnknownTaskError"]
