"""`rlscale fleet simulate`: every mode of a fleet config side by side, as a table and plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..runtime.errors import run_guarded

if TYPE_CHECKING:
    from ..simulator import SimResult

app = typer.Typer(help="Model RL fleets: discrete-event simulation of sync/async modes.",
                  no_args_is_help=True)


@app.command("simulate")
def fleet_simulate_command(
    config: Path,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted overrides, e.g. inference.workers=32 workload.steps=10")] = None,
    out: Annotated[Path | None, typer.Option(help="write plots and results JSON here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Simulate every mode of a fleet config (sync, async k, in-flight k; static and
    continuous batching) and compare throughput, utilisation and staleness."""
    run_guarded(run_fleet_simulation, config, overrides or [], out, as_json)


def run_fleet_simulation(config: Path, overrides: list[str], out: Path | None,
                         as_json: bool) -> list[SimResult]:
    """Simulate, write the plots and results JSON into `out` (if given), print the table or
    one JSON object; the results, one per mode."""
    from ..config import config_to_dict, load_config
    from ..simulator import FleetConfig, compare
    from ..simulator.report import plot_results, results_table, speedups

    cfg = load_config(FleetConfig, config, overrides)
    results = compare(cfg)
    paths = plot_results(cfg, results, out) if out is not None else []
    if out is not None:
        (out / "fleet_results.json").write_text(json.dumps(
            {"config": config_to_dict(cfg), "results": [r.to_dict() for r in results]}))
    if as_json:
        print(json.dumps({"config": cfg.name, "results": [
            {**r.to_dict(), "speedup_vs_sync": x}
            for r, x in zip(results, speedups(results), strict=True)]}))
    else:
        from rich.console import Console

        # Piped or redirected, rich would cut the table to 80 columns: give it room.
        console = Console() if sys.stdout.isatty() else Console(width=200)
        console.print(results_table(cfg, results))
        for path in paths:
            console.print(f"plot written to {path}")
    return results
