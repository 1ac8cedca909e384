"""A fleet simulation's results side by side: speed-ups over the synchronous mode, a table, and
plots of throughput, utilisation, staleness and progress."""

from __future__ import annotations

from pathlib import Path

from . import FleetConfig, SimResult


def speedups(results: list[SimResult]) -> list[float]:
    """Throughput relative to the first synchronous row (the baseline everyone quotes)."""
    base = next((r for r in results if r.mode.startswith("sync")), results[0])
    return [r.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0 for r in results]


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.1f} s"


def fleet_title(cfg: FleetConfig) -> str:
    return (f"fleet '{cfg.name}': {cfg.inference.workers} x {cfg.inference.slots} slots : "
            f"{cfg.trainer.devices} trainer devices, {cfg.workload.steps} steps")


def results_table(cfg: FleetConfig, results: list[SimResult]):
    from rich.table import Table

    table = Table(title=fleet_title(cfg))
    table.add_column("mode", no_wrap=True)
    # utilisation: busy share of inference slots and of the trainer; lag: of trained tokens
    for name in ("wall", "tok/s", "x sync", "infer", "train", "lag", "lag max", "drop"):
        table.add_column(name, justify="right")
    for r, x in zip(results, speedups(results), strict=True):
        table.add_row(r.mode, _duration(r.wall_s), f"{r.tokens_per_s:,.0f}", f"{x:.2f}x",
                      f"{r.inference_utilisation:.0%}", f"{r.trainer_utilisation:.0%}",
                      f"{r.staleness_mean:.2f}", str(r.staleness_max), f"{r.dropped_share:.1%}")
    return table


def plot_results(cfg: FleetConfig, results: list[SimResult], out: Path) -> list[Path]:
    """Throughput and utilisation per mode, staleness histograms, trained tokens over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from ..runtime.figures import save_figure

    labels = [r.mode for r in results]
    y = np.arange(len(results))
    fig, (ax_tp, ax_util) = plt.subplots(1, 2, figsize=(11, 0.45 * len(results) + 1.6),
                                         sharey=True)
    ax_tp.barh(y, [r.tokens_per_s for r in results], color="tab:blue")
    for yi, x in zip(y, speedups(results), strict=True):
        ax_tp.annotate(f"{x:.2f}x", (0, yi), xytext=(3, 0), textcoords="offset points",
                       va="center", color="white", fontsize=8)
    ax_tp.set(yticks=y, yticklabels=labels, xlabel="trained response tokens / s",
              title="throughput (x: vs sync)")
    ax_tp.invert_yaxis()
    ax_util.barh(y - 0.2, [r.inference_utilisation for r in results], 0.4,
                 label="inference slots", color="tab:orange")
    ax_util.barh(y + 0.2, [r.trainer_utilisation for r in results], 0.4,
                 label="trainer", color="tab:green")
    ax_util.set(xlim=(0, 1), xlabel="busy share of the wall time", title="utilisation")
    ax_util.legend(loc="lower right", fontsize=8)
    fig.suptitle(fleet_title(cfg))
    paths = [save_figure(fig, out / "fleet_throughput.png")]

    max_lag = max((r.staleness_max for r in results), default=0)
    lags = np.arange(max_lag + 1)
    width = 0.8 / len(results)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, r in enumerate(results):
        total = max(r.trained_tokens, 1)
        ax.bar(lags - 0.4 + (i + 0.5) * width,
               [r.staleness_hist.get(int(lag), 0) / total for lag in lags], width, label=r.mode)
    ax.set(xticks=lags, xlabel="version lag of a trained token", ylabel="share of tokens",
           title=f"{fleet_title(cfg)}\nstaleness of trained tokens")
    ax.legend(fontsize=7, ncols=2)
    paths.append(save_figure(fig, out / "fleet_staleness.png"))

    fig, ax = plt.subplots(figsize=(8, 3.8))
    hours = max(r.wall_s for r in results) >= 3600
    unit = 3600.0 if hours else 1.0
    for r in results:
        ends = [s.train_end_s / unit for s in r.timeline]
        ax.plot([0, *ends], [0, *np.cumsum([s.response_tokens for s in r.timeline])],
                label=r.mode, lw=1.2)
    ax.set(xlabel="wall time (h)" if hours else "wall time (s)", ylabel="trained response tokens",
           title=f"{fleet_title(cfg)}\nprogress of training")
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out / "fleet_timeline.png"))
    return paths
