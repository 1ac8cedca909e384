"""Writing matplotlib figures next to runs (shared by the RLVR and Zero plots)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, out: str | Path, dpi: int = 120) -> Path:
    """Lay out `fig`, write it to `out` (creating its folder) and close it."""
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out
