"""Per-step metrics: one JSON object per line in metrics.jsonl, mirrored to TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLogger:
    def __init__(
        self, run_dir: str | Path, *, tensorboard: bool = True, resume_step: int | None = None
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if self.path.exists():
            # A resumed run repeats the steps after its checkpoint; drop their old lines so
            # every step appears exactly once. A fresh run starts a fresh file.
            keep = []
            if resume_step is not None:
                for line in self.path.read_text().splitlines():
                    try:
                        if json.loads(line).get("step", 0) <= resume_step:
                            keep.append(line)
                    except json.JSONDecodeError:
                        continue  # a line torn by a kill mid-write
            self.path.write_text("".join(f"{line}\n" for line in keep))
        self._file = open(self.path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=(
                resume_step + 1 if resume_step is not None else None))

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)
        return row

    def log_histogram(self, step: int, name: str, values: Any) -> None:
        if self._tb is not None:
            self._tb.add_histogram(name, values, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class StepProgress:
    """A rich progress bar with a few live figures; silent when disabled or not a terminal."""

    def __init__(self, total: int, description: str, *, enabled: bool = True,
                 completed: int = 0, fields: tuple[str, ...] = ()) -> None:
        self.fields = fields
        self._progress = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[live]}"),
            transient=False)
        self._task = self._progress.add_task(description, total=total, completed=completed,
                                             live="")
        self._progress.start()

    def update(self, completed: int, values: dict[str, Any]) -> None:
        if self._progress is None:
            return
        live = "  ".join(f"{k} {values[k]:.3g}" for k in self.fields
                         if isinstance(values.get(k), int | float))
        self._progress.update(self._task, completed=completed, live=live)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
