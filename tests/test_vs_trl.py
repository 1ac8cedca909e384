"""benchmarks/vs_trl.py end to end on its smallest cell: both sides train and are timed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_vs_trl_smoke_table(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "vs_trl.py"), "--models", "tiny", "--tokens",
         "16", "--precision", "fp32", "--steps", "1", "--warmup", "1", "--repeats", "1",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| fp32 | tiny")]
    assert len(rows) == 1, proc.stdout
    ratio = re.search(r"\| ([0-9.]+)x \|", rows[0])
    assert ratio is not None and float(ratio.group(1)) > 0, rows[0]
    cell = json.loads((tmp_path / "results.json").read_text())["cells"][0]
    # the bound at the lengths each side sampled never exceeds the full-budget one, and is
    # that one when every row ran the whole budget
    for side in ("rlscale", "trl"):
        at_lengths = cell["lower_bound_at_sampled_lengths_s"][side]
        assert 0 < at_lengths <= cell["lower_bound_s"] * (1 + 1e-9)
        if cell[side]["mean_length"] == 16:
            assert at_lengths == pytest.approx(cell["lower_bound_s"])
    assert cell["runs"]["trl"][0]["generation_in_window"]
    for side in ("rlscale", "trl"):
        run = cell["runs"][side][0]
        assert run["steps"] == 2 and len(run["step_s"]) == 1
        assert 0 < run["length"][0] <= 16
