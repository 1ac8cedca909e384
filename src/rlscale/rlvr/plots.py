"""Plots written next to the runs (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..runtime.figures import save_figure  # noqa: E402
from ..runtime.metrics import read_metrics  # noqa: E402


def plot_pass_at_k(curves: dict[str, dict[int, float]], out: str | Path,
                   title: str = "pass@k") -> Path:
    """pass@k against k (log2 axis), one line per model."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in curves.items():
        ks = sorted(values)
        ax.plot(ks, [values[k] for k in ks], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save_figure(fig, out)


def plot_training(run_dirs: dict[str, str | Path], keys: list[str], out: str | Path) -> Path:
    """One panel per metric key against step, one line per run."""
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.5), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for label, run_dir in run_dirs.items():
            rows = [r for r in read_metrics(run_dir) if isinstance(r.get(key), int | float)]
            if rows:
                ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=label)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, out, dpi=110)
