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


def plot_training(run_dirs: dict[str, str | Path], keys: list[str | tuple[str, ...]],
                  out: str | Path) -> Path:
    """One panel per metric key (or tuple of keys sharing a panel) against step, one line
    per run and key."""
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.5), squeeze=False)
    for ax, panel in zip(axes[0], keys, strict=True):
        panel_keys = (panel,) if isinstance(panel, str) else panel
        for label, run_dir in run_dirs.items():
            metrics = read_metrics(run_dir)
            for key in panel_keys:
                rows = [r for r in metrics if isinstance(r.get(key), int | float)]
                if rows:
                    name = label if len(panel_keys) == 1 else f"{label} {key.split('/')[-1]}"
                    ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=name)
        ax.set_title(" vs ".join(panel_keys))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return save_figure(fig, out, dpi=110)
