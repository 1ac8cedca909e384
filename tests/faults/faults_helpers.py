"""Small RLVR and Zero configs and helpers shared by the fault-injection suite."""

import os
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from rlscale.cli import app


def rlvr_config(tmp_path: Path, model_dir: Path, run_dir: Path, **sections) -> Path:
    cfg = {
        "run_dir": str(run_dir),
        "model": {"path": str(model_dir)},
        "task": {"name": "arithmetic", "options": {"add_digits": 1}},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3},
        "train": {"steps": 3, "lr": 1e-3, "seed": 1, "threads": 1},
        "checkpoint": {"every": 2, "keep": 3},
        "tensorboard": False,
        "progress": False,
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / f"rlvr-{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def zero_config(tmp_path: Path, out: Path, **sections) -> Path:
    cfg = {
        "name": "faults",
        "out": str(out),
        "network": {"blocks": 0, "channels": 4, "value_hidden": 4},
        "mcts": {"simulations": 4},
        "selfplay": {"concurrent_games": 4, "games_per_iteration": 4},
        "replay": {"capacity": 500},
        "train": {"iterations": 3, "batch_size": 16, "min_replay": 1, "sample_reuse": 1.0},
        "checkpoint": {"every": 1, "keep": 3},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / f"zero-{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real command in a fresh process (for kills and concurrent runs)."""
    return subprocess.run([sys.executable, "-m", "rlscale.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def one_line_error(result, *words, status: int = 2) -> str:
    code = getattr(result, "exit_code", getattr(result, "returncode", None))
    stderr = result.stderr
    output = getattr(result, "output", "") or getattr(result, "stdout", "")
    assert code == status, (code, output, stderr, getattr(result, "exception", None))
    assert "Traceback" not in stderr + output, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def steps_of(run_dir: Path) -> list[int]:
    import json

    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
