"""The experiments' figures: matplotlib, headless, mean ± SE over seeds."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..runtime.figures import save_figure  # noqa: E402
from .stats import curve  # noqa: E402

__all__ = ["band", "bars", "grouped_bars", "plt", "save_figure", "tidy"]


def band(ax, x: Sequence[float], per_seed: Sequence[Sequence[float]], label: str,
         **style) -> None:
    """The mean over seeds as a line, ± one standard error as a shaded band."""
    mean, se = curve(per_seed)
    line, = ax.plot(x, mean, label=label, **style)
    ax.fill_between(x, [m - s for m, s in zip(mean, se, strict=True)],
                    [m + s for m, s in zip(mean, se, strict=True)], alpha=0.2,
                    color=line.get_color())


def bars(ax, labels: Sequence[str], per_seed: Sequence[Sequence[float]], title: str,
         colored: bool = False, spread: str = "mean ± SE over seeds") -> None:
    """One bar per arm: the mean of its per-seed values, ± one standard error; `colored`:
    each arm in its own colour (C0, C1, ... as its curves elsewhere in the figure);
    `spread`: what the title says the bars show."""
    mean_se = [curve([[v] for v in values]) for values in per_seed]
    style = {"color": [f"C{i}" for i in range(len(labels))]} if colored else {}
    ax.bar(range(len(labels)), [mean[0] for mean, _ in mean_se],
           yerr=[se[0] for _, se in mean_se], capsize=6,
           tick_label=[label.replace("_", " ") for label in labels], **style)
    ax.set_title(f"{title} ({spread})")
    tidy(ax, axis="y", legend=False)


def tidy(*axes, axis: str = "both", which: str = "major", legend: bool = True) -> None:
    """Every experiment figure's panel style: a light grid (on `axis`: "y" under bars) and,
    with `legend`, a small legend of what is drawn so far (call it after the labelled lines)."""
    for ax in axes:
        ax.grid(alpha=0.3, axis=axis, which=which)
        if legend:
            ax.legend(fontsize=8)


def grouped_bars(ax, tick_labels: Sequence[str],
                 groups: Sequence[tuple[str, Sequence[Sequence[float]]]]) -> None:
    """Side by side at each tick, one bar per group (label, per-seed values of each tick):
    the mean over seeds, ± one standard error."""
    width = 0.8 / len(groups)
    for offset, (label, per_tick) in enumerate(groups):
        mean_se = [curve([[v] for v in values]) for values in per_tick]
        ax.bar([i + width * offset for i in range(len(tick_labels))],
               [mean[0] for mean, _ in mean_se], width=width,
               yerr=[se[0] for _, se in mean_se], capsize=4, label=label)
    ax.set_xticks([i + width * (len(groups) - 1) / 2 for i in range(len(tick_labels))],
                  tick_labels, fontsize=8)


def pass1_curves(ax_steps, ax_other, curves: dict[str, list[dict]], other: str,
                 other_label: str) -> None:
    """Each arm's held-out eval curves (`{label: per-seed curves}`, each with `steps`,
    `pass@1` and the x values `other`): pass@1 against training steps (mean ± SE) on
    `ax_steps`, and against `other` on `ax_other`, one line per seed (the x values differ
    per seed), in the arm's colour."""
    for i, (label, per_seed) in enumerate(curves.items()):
        band(ax_steps, per_seed[0]["steps"], [c["pass@1"] for c in per_seed], label,
             marker="o")
        for j, c in enumerate(per_seed):
            ax_other.plot(c[other], c["pass@1"], marker="o", alpha=0.8, color=f"C{i}",
                          label=label if j == 0 else None)
    ax_steps.set_xlabel("training step")
    ax_other.set_xlabel(other_label)
    for ax in (ax_steps, ax_other):
        ax.set_ylabel("held-out pass@1 (loop eval)")
    ax_steps.set_title("pass@1 against steps (mean ± SE)")
    ax_other.set_title(f"pass@1 against {other_label} (each seed)")
