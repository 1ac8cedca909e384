"""The experiments' figures: matplotlib, headless, mean ± SE over seeds."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..runtime.figures import save_figure  # noqa: E402
from .stats import curve  # noqa: E402

__all__ = ["band", "plt", "save_figure"]


def band(ax, x: Sequence[float], per_seed: Sequence[Sequence[float]], label: str,
         **style) -> None:
    """The mean over seeds as a line, ± one standard error as a shaded band."""
    mean, se = curve(per_seed)
    line, = ax.plot(x, mean, label=label, **style)
    ax.fill_between(x, [m - s for m, s in zip(mean, se, strict=True)],
                    [m + s for m, s in zip(mean, se, strict=True)], alpha=0.2,
                    color=line.get_color())
