"""Elo during training: a run's checkpoints against each other and fixed anchors.

Players. Every network the run saved (`checkpoints/step_NNNNNN/`, the milestone networks of
`checkpoint.networks_every` in `networks/step_NNNNNN/`, and `final/` when it is later than
both), each with `simulations` of its saved play search, and the anchors (`random`, `mcts:N`,
...: agents that do not change).

Schedule (`schedule`). Each checkpoint plays every anchor and its next `neighbours`
checkpoints; the anchors play each other. Every pairing is a `play_match` of `games` games
(pairs of games sharing a random opening, colours swapped).

Ratings: the joint Bradley-Terry fit of zero/ratings.py (`fit_ratings`), the first anchor
(`random` by default) fixed at 0.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .agents import Agent
from .games.base import Game
from .matches import MatchResult, play_match
from .ratings import Rating, fit_ratings


@dataclass(frozen=True)
class Checkpoint:
    """One saved network of a run, with where it stands in training."""

    name: str  # "iter 40"
    path: Path
    iteration: int
    selfplay_games: int | None  # self-play games played before it was saved


def schedule(checkpoints: Sequence[str], anchors: Sequence[str],
             neighbours: int = 2) -> list[tuple[str, str]]:
    """The pairings: the anchors with each other, each checkpoint with every anchor and with
    its next `neighbours` checkpoints (all of them when `neighbours` >= their number)."""
    pairs = [(a, b) for i, a in enumerate(anchors) for b in anchors[i + 1:]]
    for i, name in enumerate(checkpoints):
        pairs += [(name, anchor) for anchor in anchors]
        pairs += [(name, later) for later in checkpoints[i + 1: i + 1 + neighbours]]
    return pairs


def find_checkpoints(run_dir: str | Path) -> list[Checkpoint]:
    """The run's saved networks, oldest first, one per iteration: every `checkpoints/step_*`
    and `networks/step_*`, and `final/` when it is later than the last of them. Raises a
    one-line error when there are none."""
    from ..runtime.checkpoint import NETWORKS_DIR, checkpoint_step, list_checkpoints
    from .network import read_meta

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory at {run_dir}")
    games_at = _selfplay_games_by_iteration(run_dir / "metrics.jsonl")
    found: list[Checkpoint] = []
    saved = {checkpoint_step(p): p for folder in (NETWORKS_DIR, "checkpoints")
             for p in list_checkpoints(run_dir, folder) if (p / "model.json").is_file()}
    paths = [saved[step] for step in sorted(saved)]  # a checkpoint over a network of its step
    if (run_dir / "final" / "model.json").is_file():
        paths.append(run_dir / "final")
    for path in paths:
        counters = read_meta(path).extra.get("counters", {})
        if "iteration" in counters:
            iteration = int(counters["iteration"])
        elif path.name != "final":
            iteration = checkpoint_step(path)
        else:
            iteration = max((c.iteration for c in found), default=0) + 1
        if found and iteration <= found[-1].iteration:  # final/ = the last checkpoint
            continue
        games = counters.get("games", games_at.get(iteration))
        found.append(Checkpoint(f"iter {iteration}", path, iteration,
                                None if games is None else int(games)))
    if not found:
        raise ValueError(f"no checkpoints in {run_dir} (checkpoints/step_*/model.json, "
                         "networks/step_*/model.json or final/model.json)")
    return found


def _selfplay_games_by_iteration(metrics: Path) -> dict[int, int]:
    out: dict[int, int] = {}
    if not metrics.is_file():
        return out
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed run
        if "step" in row and "counters/games" in row:
            out[int(row["step"])] = int(row["counters/games"])
    return out


@dataclass
class EloCurve:
    run_dir: str
    anchor: str  # the player fixed at 0
    anchors: list[str]
    checkpoints: list[Checkpoint]
    results: list[MatchResult]
    ratings: dict[str, Rating]
    settings: dict[str, Any] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """One row per player: checkpoints in training order, then the anchors."""
        rows = []
        for c in self.checkpoints:
            r = self.ratings[c.name]
            rows.append({"player": c.name, "kind": "checkpoint", "iteration": c.iteration,
                         "selfplay_games": c.selfplay_games, "elo": r.elo, "low": r.low,
                         "high": r.high, "games": r.games, "path": _relative(c.path, self.run_dir)})
        for name in self.anchors:
            r = self.ratings[name]
            rows.append({"player": name, "kind": "anchor", "iteration": None,
                         "selfplay_games": None, "elo": r.elo, "low": r.low, "high": r.high,
                         "games": r.games, "path": None})
        return rows

    def as_dict(self) -> dict[str, Any]:
        matches = [{"a": r.agent_a, "b": r.agent_b, "wins": r.wins, "draws": r.draws,
                    "losses": r.losses, "score": r.score, "seconds": round(r.seconds, 2)}
                   for r in self.results]
        return {"run_dir": self.run_dir, "anchor": self.anchor, "settings": self.settings,
                "players": [_rounded(row) for row in self.rows()], "matches": matches}


def _relative(path: Path, run_dir: str) -> str:
    try:
        return str(path.relative_to(run_dir))
    except ValueError:
        return str(path)


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}


def play_pairings(
    game: Game,
    players: dict[str, Agent],
    pairs: Sequence[tuple[str, str]],
    games: int,
    seed: int = 0,
    opening_plies: int = 2,
    on_match: Callable[[MatchResult], None] | None = None,
) -> list[MatchResult]:
    """A `play_match` of `games` games for each pairing of `players` (by name), pairing k
    with seed `seed + k`; each result carries the players' names, whatever their agents
    call themselves, as `fit_ratings` needs."""
    results = []
    for number, (a, b) in enumerate(pairs):
        result = play_match(game, players[a], players[b], games, seed=seed + number,
                            opening_plies=opening_plies)
        result.agent_a, result.agent_b = a, b
        results.append(result)
        if on_match is not None:
            on_match(result)
    return results


def elo_curve(
    checkpoints: Sequence[Checkpoint],
    load_checkpoint: Callable[[Checkpoint], Agent],
    anchors: dict[str, Agent],
    games: int,
    seed: int = 0,
    neighbours: int = 2,
    opening_plies: int = 2,
    run_dir: str | Path = "",
    on_match: Callable[[MatchResult], None] | None = None,
) -> EloCurve:
    """Play the schedule of `checkpoints` (as agents from `load_checkpoint`) and `anchors`
    (by name; the first is fixed at 0), pairing k with seed `seed + k`; fit the ratings."""
    if games < 1:
        raise ValueError(f"--games must be at least 1, got {games}")
    if neighbours < 0:
        raise ValueError(f"--neighbours must be at least 0, got {neighbours}")
    if not anchors:
        raise ValueError("at least one anchor is needed (e.g. random)")
    if not checkpoints:
        raise ValueError("no checkpoints to rate")
    players: dict[str, Agent] = dict(anchors)
    for c in checkpoints:
        players[c.name] = load_checkpoint(c)
    game = players[checkpoints[0].name].game
    pairs = schedule([c.name for c in checkpoints], list(anchors), neighbours)
    results = play_pairings(game, players, pairs, games, seed, opening_plies, on_match)
    anchor = next(iter(anchors))
    return EloCurve(str(run_dir), anchor, list(anchors), list(checkpoints), results,
                    fit_ratings(results, anchor),
                    {"games_per_pairing": games, "seed": seed, "neighbours": neighbours,
                     "opening_plies": opening_plies})


def elo_table(curve: EloCurve) -> str:
    lines = [f"| player | iteration | self-play games | Elo (95% CI, {curve.anchor} = 0) | games |",
             "| --- | ---: | ---: | --- | ---: |"]
    for row in curve.rows():
        it = "" if row["iteration"] is None else str(row["iteration"])
        sp = "" if row["selfplay_games"] is None else f"{row['selfplay_games']:,}"
        lines.append(f"| {row['player']} | {it} | {sp} | {row['elo']:+.0f} "
                     f"[{row['low']:+.0f}, {row['high']:+.0f}] | {row['games']} |")
    return "\n".join(lines)


def write_elo_curve(curve: EloCurve, out: str | Path) -> list[Path]:
    """`elo_curve.md` (table), `elo_curve.json` (players, matches, settings),
    `elo_curve.csv` (one row per player) and `elo_curve.png` into the folder `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "elo_curve.md", out / "elo_curve.json", out / "elo_curve.csv"]
    paths[0].write_text(elo_table(curve) + "\n")
    paths[1].write_text(json.dumps(curve.as_dict(), indent=2) + "\n")
    rows = [_rounded(row) for row in curve.rows()]
    with open(paths[2], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return paths + [plot_elo_curve(curve, out / "elo_curve.png")]


def plot_elo_curve(curve: EloCurve, out: str | Path, title: str = "") -> Path:
    """Two panels, Elo against iteration and against self-play games, with the intervals;
    the anchors as horizontal lines with their bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..runtime.figures import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key, label in ((axes[0], "iteration", "iteration"),
                           (axes[1], "selfplay_games", "self-play games")):
        points = [(getattr(c, key), curve.ratings[c.name]) for c in curve.checkpoints
                  if getattr(c, key) is not None]
        if points:
            xs = [x for x, _ in points]
            ys = [r.elo for _, r in points]
            err = [[r.elo - r.low for _, r in points], [r.high - r.elo for _, r in points]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label="checkpoints (95% CI)")
        for i, name in enumerate(curve.anchors):
            r = curve.ratings[name]
            colour = f"C{i + 1}"
            ax.axhline(r.elo, color=colour, ls="--", lw=1, label=name)
            if name != curve.anchor:
                ax.axhspan(r.low, r.high, color=colour, alpha=0.12)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"Elo ({curve.anchor} = 0)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title or f"Elo during training: {Path(curve.run_dir).name}")
    return save_figure(fig, out)
