"""benchmarks/go_selfplay.py end to end on a tiny setting: two recipes side by side, the table,
results.json, and a time breakdown that partitions the instrumented window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = "network.blocks=1,network.channels=8,network.value_hidden=8,selfplay.concurrent_games=8"


def test_go_selfplay_bench_smoke(tmp_path):
    go7 = REPO / "configs" / "zero" / "go7.yaml"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "go_selfplay.py"),
         "--recipe", f"old={go7},{TINY}", "--recipe", f"new={go7},{TINY},mcts.simulations=8",
         "--precision", "float32", "--threads", "1", "--seconds", "1.5",
         "--breakdown-seconds", "1", "--limit-seconds", "0.3", "--out", str(tmp_path),
         "game.kwargs.size=5"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "avx512_bf16" in out and "| recipe, dtype |" in out, out
    for name in ("old", "new"):
        assert any(line.startswith(f"| {name}, float32 |") for line in out.splitlines()), out
    assert "| network forward |" in out and "| rest (Python) |" in out, out

    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["machine"]["flags"]) >= {"avx2", "avx512f", "avx512_bf16", "amx_tile"}
    cells = results["cells"]
    assert [(c["recipe"], c["compute_dtype"]) for c in cells] == [("old", "float32"),
                                                                 ("new", "float32")]
    assert [c["config"]["simulations"] for c in cells] == [32, 8]
    for cell in cells:
        assert cell["config"]["game_kwargs"]["size"] == 5 and cell["threads"] == 1
        for key in ("games_per_hour", "simulations_per_s", "positions_per_s", "cores_used"):
            assert cell[key] > 0, (key, cell[key])
        limit = cell["limit"]
        assert 1 <= limit["batch"] <= 8
        assert limit["forward_positions_per_s"] > 0 and limit["evaluate_positions_per_s"] > 0
        assert 0 < cell["positions_vs_limit"] and 0 < cell["simulations_vs_limit"]
        shares = cell["breakdown"]["shares"]
        assert set(shares) == {"network forward", "batching & features", "tree",
                               "game kernels (numba)", "game rules (Python)", "rest (Python)"}
        assert all(share >= 0 for share in shares.values())
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
        assert shares["network forward"] > 0 and shares["tree"] > 0
        functions = cell["breakdown"]["functions"]
        assert functions["go._legal"]["calls"] > 0 and functions["Go.apply"]["calls"] > 0
