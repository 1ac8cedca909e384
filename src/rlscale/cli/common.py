"""What the command modules share: the process set-up every command does before heavy work
(every core to torch unless OMP_NUM_THREADS says otherwise; the libraries' own progress bars
and chatter off: our progress and messages are the output), the command list's layout, and
the small parsers of option values."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import pydantic
from typer.core import TyperGroup

from ..config import M, apply_overrides, build_config, set_dotted


def prepare_command_process() -> None:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)


class CommandList(TyperGroup):
    """A command group whose list shows each command's first paragraph whole (wrapped), as
    typer's rich help did: click cuts it to one 80-column line, or at the first full stop
    (even the one of "e.g.")."""

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                text = inspect.cleandoc(command.short_help or command.help or "")
                rows.append((name, " ".join(text.split("\n\n")[0].split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def parse_ks(text: str) -> tuple[int, ...]:
    """`--k 1,4,8` as sorted distinct positive integers, or a one-line ValueError."""
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ValueError(f"--k needs comma-separated positive integers, got '{text[:40]}'") from None
    if not ks or min(ks) < 1:
        raise ValueError(f"--k needs positive integers, got '{text[:40]}'")
    return ks


def png_path(path: Path, name: str) -> Path:
    """An existing folder gets the plot inside it, not a `DIR.png` beside it."""
    return path / name if path.is_dir() else path


def config_from_options(model_cls: type[M], options: dict[str, tuple[str, Any]],
                        overrides: list[str]) -> M:
    """A command's config from its options, `{dotted key: (option, value)}`, with the
    `key=value` overrides applied on top (an override wins over an option). A bad value is one
    line naming the override that set it, else the option."""
    data: dict[str, Any] = {}
    for key, (_, value) in options.items():
        set_dotted(data, key, value)
    apply_overrides(data, overrides)
    try:
        return model_cls.model_validate(data)
    except pydantic.ValidationError as err:
        loc = ".".join(str(part) for part in err.errors()[0]["loc"])
    # the last override of a key wins, and an override wins over an option
    blamed = [f"command line ({item[:60]!r})" for item in reversed(overrides)
              if _covers(item.partition("=")[0].strip(), loc)]
    blamed += [option for key, (option, _) in options.items() if _covers(key, loc)]
    source = blamed[0] if blamed else "command line"
    return build_config(model_cls, data, source)  # raises the same complaint as one line


def _covers(key: str, loc: str) -> bool:
    return loc == key or loc.startswith(key + ".") or key.startswith(loc + ".")
