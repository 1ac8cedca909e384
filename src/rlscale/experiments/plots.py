"""The experiments' figures: matplotlib, headless, mean ± SE over seeds."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..runtime.figures import save_figure  # noqa: E402
from .stats import curve  # noqa: E402

__all__ = ["band", "bars", "plt", "save_figure"]


def band(ax, x: Sequence[float], per_seed: Sequence[Sequence[float]], label: str,
         **style) -> None:
    """The mean over seeds as a line, ± one standard error as a shaded band."""
    mean, se = curve(per_seed)
    line, = ax.plot(x, mean, label=label, **style)
    ax.fill_between(x, [m - s for m, s in zip(mean, se, strict=True)],
                    [m + s for m, s in zip(mean, se, strict=True)], alpha=0.2,
                    color=line.get_color())


def bars(ax, labels: Sequence[str], per_seed: Sequence[Sequence[float]], title: str,
         colored: bool = False) -> None:
    """One bar per arm: the mean of its per-seed values, ± one standard error; `colored`:
    each arm in its own colour (C0, C1, ... as its curves elsewhere in the figure)."""
    mean_se = [curve([[v] for v in values]) for values in per_seed]
    style = {"color": [f"C{i}" for i in range(len(labels))]} if colored else {}
    ax.bar(range(len(labels)), [mean[0] for mean, _ in mean_se],
           yerr=[se[0] for _, se in mean_se], capsize=6,
           tick_label=[label.replace("_", " ") for label in labels], **style)
    ax.set_title(f"{title} (mean ± SE over seeds)")
    ax.grid(alpha=0.3, axis="y")
