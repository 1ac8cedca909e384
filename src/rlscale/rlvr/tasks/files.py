"""Tasks from a user's own data: `jsonl:<path>`, `parquet:<path>`, `hf:<folder>`.

Every row has a prompt (a text field, `prompt` by default, or a chat field, `messages`: a
list of {role, content}) and a reference answer (`answer`). `hf:` is a folder written by
`datasets`' `save_to_disk`: a `Dataset`, or a `DatasetDict` whose `train` and `test`
splits become the task's splits. Otherwise the split comes from a field (`split_field`,
values `train`/`test`) or, by default, from a hash of the prompt (`test_share`).

The verifier (`verifier`): `math_verify` (the default; `\\frac{1}{2}` equals `0.5`),
`exact` (the stripped completion is the answer text), or a user function
`package.module:function` called as `(completion, example) -> float`, where
`example.answer` is the reference and `example.meta["row"]` the whole row.

For supervised fine-tuning the demonstration is `demonstration_template` filled with the
row's fields (default `{answer}`). A trailing assistant message in a chat row is the
demonstration instead, and is not part of the prompt.

JSONL is read line by line with `json` (so a bad line is named by its number) and Parquet
with pyarrow (`datasets`' own loaders would first copy the file into a cache under the home
directory); `hf:` folders are read with `datasets.load_from_disk`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from ...runtime.dotted import import_callable
from .answers import CHECKERS
from .base import (
    SPLITS,
    ChatMessage,
    Example,
    TaskOptionError,
    change_one_digit,
    check_option,
    check_split,
    split_of,
)

FORMATS = ("jsonl", "parquet", "hf")
ROLES = ("system", "user", "assistant")


class DatasetError(ValueError):
    """A data file that cannot be used as a task (one line naming the file and the problem)."""


def read_rows(kind: str, path: Path) -> dict[str | None, list[dict[str, Any]]]:
    """Rows by split name (None: one unsplit table)."""
    if not path.exists():
        raise DatasetError(f"{kind} data not found: {path}")
    if kind == "jsonl":
        return {None: _read_jsonl(path)}
    if kind == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError("parquet data needs pyarrow (pip install 'rlscale[tasks]')") from None
        try:
            return {None: pq.read_table(path).to_pylist()}
        except Exception as exc:
            raise DatasetError(f"cannot read parquet file {path}: {_first_line(exc)}") from None
    try:
        import datasets
    except ImportError:
        raise DatasetError("hf: data needs the datasets package (pip install 'rlscale[tasks]')") from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DatasetError(f"cannot load a datasets folder (save_to_disk) from {path}: "
                           f"{_first_line(exc)}") from None
    if isinstance(loaded, datasets.DatasetDict):
        unknown = sorted(set(loaded) - set(SPLITS))
        if unknown or "train" not in loaded:
            raise DatasetError(f"datasets folder {path} has splits {sorted(loaded)}; "
                               "expected train (and optionally test)")
        return {name: loaded[name].to_list() for name in loaded}
    return {None: loaded.to_list()}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path} line {number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path} line {number}: a JSON object per line expected, "
                                   f"got {type(row).__name__}")
            rows.append(row)
    return rows


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class DatasetTask:
    """Rows of a data file behind the Task protocol (rlvr/tasks/base.py)."""

    def __init__(self, kind: str, path: str, *, prompt_field: str = "prompt",
                 messages_field: str = "messages", answer_field: str = "answer",
                 split_field: str | None = None, test_share: float = 0.1,
                 verifier: str = "math_verify", demonstration_template: str = "{answer}") -> None:
        if kind not in FORMATS:
            raise TaskOptionError(f"unknown data format '{kind}' (known: {', '.join(FORMATS)})")
        self.name = f"{kind}:{path}"
        self.path = Path(path)
        self.prompt_field, self.messages_field = prompt_field, messages_field
        self.answer_field, self.split_field = answer_field, split_field
        self.test_share = test_share
        self.demonstration_template = demonstration_template
        check_option(self.name, "test_share", test_share, float, 0, 1)
        self.verifier = verifier
        if verifier in CHECKERS:
            self._check = None
        else:  # fail now, in the trainer, not later in every verifier call
            self._check = import_callable(verifier, what=f"task '{self.name}' verifier")
        self._splits = self._build_splits(read_rows(kind, self.path))
        if not self._splits["train"]:
            raise DatasetError(f"{self.name}: no training rows")

    # A verifier worker gets the task with every chunk: it needs the checker, not the rows.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_splits"] = None
        return state

    def _build_splits(self, tables: dict[str | None, list[dict[str, Any]]]) -> dict[str, list[Example]]:
        splits: dict[str, list[Example]] = {name: [] for name in SPLITS}
        for table_split, rows in tables.items():
            for number, row in enumerate(rows, 1):
                where = f"{self.name} row {number}" + (f" of split {table_split}" if table_split else "")
                example = self._example(row, where)
                splits[table_split or self._split_of(row, example, where)].append(example)
        return splits

    def _split_of(self, row: dict[str, Any], example: Example, where: str) -> str:
        if self.split_field is None:
            return split_of(example.prompt, self.test_share)
        value = row.get(self.split_field)
        if value not in SPLITS:
            raise DatasetError(f"{where}: split field '{self.split_field}' must be train or "
                               f"test, got {str(value)[:40]!r}")
        return value

    def _example(self, row: dict[str, Any], where: str) -> Example:
        if self.answer_field not in row:
            raise DatasetError(f"{where}: no answer field '{self.answer_field}' "
                               f"(fields: {', '.join(sorted(row))[:120]})")
        messages = None
        demonstration = None
        if self.prompt_field in row:
            prompt = row[self.prompt_field]
            if not isinstance(prompt, str):
                raise DatasetError(f"{where}: prompt field '{self.prompt_field}' must be text")
        elif self.messages_field in row:
            messages = _messages(row[self.messages_field], self.messages_field, where)
            if messages[-1].role == "assistant":
                demonstration = messages[-1].content
                messages = messages[:-1]
            if not messages or messages[-1].role != "user":
                raise DatasetError(f"{where}: chat field '{self.messages_field}' must end with "
                                   "a user message (or a user message and its assistant reply)")
            prompt = "\n".join(f"{m.role}: {m.content}" for m in messages)
        else:
            raise DatasetError(f"{where}: no prompt field '{self.prompt_field}' or chat field "
                               f"'{self.messages_field}' (fields: {', '.join(sorted(row))[:120]})")
        meta = {"row": row}
        if demonstration is not None:
            meta["demonstration"] = demonstration
        return Example(prompt=prompt, answer=row[self.answer_field], meta=meta, messages=messages)

    def sample(self, split: str, rng: random.Random) -> Example:
        check_split(self.name, split)
        rows = self._splits[split]
        if not rows:
            raise TaskOptionError(f"{self.name} has no '{split}' rows (set task.options."
                                  f"test_share above 0 or give a split field)")
        return rows[rng.randrange(len(rows))]

    def split_examples(self, split: str) -> list[Example]:
        """Every example of `split`, in file order (a finite task: evaluation uses them all)."""
        check_split(self.name, split)
        return list(self._splits[split])

    def verify(self, completion: str, example: Example) -> float:
        if self._check is not None:
            return float(self._check(completion, example))
        return CHECKERS[self.verifier](completion, example.answer)

    def demonstration(self, example: Example, rng: random.Random) -> str:
        if "demonstration" in example.meta:
            return example.meta["demonstration"]
        try:
            return self.demonstration_template.format(**example.meta["row"])
        except (KeyError, IndexError, ValueError) as exc:
            raise TaskOptionError(f"task '{self.name}' option demonstration_template "
                                  f"{self.demonstration_template!r}: {_first_line(exc)}") from None

    def corrupt(self, example: Example, rng: random.Random) -> str:
        """A wrong demonstration (`rlscale sft data.wrong_share`): one digit of the right one
        changed (`$\\frac{7}{2}$` -> `$\\frac{7}{5}$`), or ` ?` appended when it has no digit."""
        good = self.demonstration(example, rng)
        wrong = change_one_digit(good, rng)
        return wrong if wrong is not None else f"{good} ?"


def _messages(value: Any, field: str, where: str) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}: chat field '{field}' must be a non-empty list of messages")
    out = []
    for m in value:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise DatasetError(f"{where}: chat field '{field}' needs messages with a role "
                               f"({', '.join(ROLES)}) and text content, got {str(m)[:60]}")
        out.append(ChatMessage(m["role"], m["content"]))
    return tuple(out)
