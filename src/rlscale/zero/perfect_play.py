"""Connect Four judged by the perfect solver (`rlscale.zero.solver`): solver agreement on the
benchmark positions and audits of played matches (agents from `zero.agents`, match records
from `zero.matches`).

Solver agreement (`solver_agreement`). On the benchmark positions of `shared/data/connect4`, a
move is a mistake when another legal move has a strictly better perfect-play outcome
(win > draw > loss, `solver.move_values(weak=True)`); the agreement is the share of positions
with no mistake. Faster wins and slower losses are not asked for.

Match audit (`audit_match`, Connect Four). Every position of every game after its opening is
solved, so each game gets A's perfect-play value once the opening is played, its result, and
each agent's outcome-changing moves (a move that turns its side's win into a draw or loss, or a
draw into a loss): who threw away what, rather than only who won.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .agents import Agent, act_many
from .games.base import IllegalMove
from .matches import GameRecord, MatchResult

AGREEMENT_FILES = ("Test_L3_R1", "Test_L2_R1", "Test_L2_R2")


def connect4_data_dir() -> Path:
    """`<repo>/../shared/data/connect4`, the solver benchmark positions."""
    return Path(__file__).resolve().parents[3].parent / "shared" / "data" / "connect4"


# -- solver agreement (Connect Four) ---------------------------------------------------------


@dataclass
class AgreementResult:
    file: str
    positions: int
    agreed: int

    @property
    def share(self) -> float:
        return self.agreed / max(self.positions, 1)


def read_positions(name: str | Path, data_dir: str | Path | None = None,
                   limit: int | None = None) -> list[str]:
    """The move strings of a benchmark file (`Test_L3_R1` or a path), first `limit` lines."""
    path = Path(name)
    if not path.is_file():
        path = Path(data_dir or connect4_data_dir()) / str(name)
    if not path.is_file():
        raise FileNotFoundError(f"no Connect Four position file {name!r} (looked in {path}); "
                                "the benchmark positions (Test_L1_R1 ... Test_L3_R1, Pascal "
                                "Pons' format) are not in the repository: pass --data-dir DIR")
    positions = []
    for line in path.read_text().splitlines():
        if line.strip():
            positions.append(line.split()[0])
        if limit is not None and len(positions) >= limit:
            break
    return positions


def keeps_value(state: Any, action: int) -> bool:
    """True unless another legal move has a strictly better perfect-play outcome."""
    from .solver import move_values

    values = move_values(state, weak=True)
    if values[action] is None:
        raise IllegalMove(f"column {action + 1} is not legal in {state.moves!r}")
    return values[action] == max(v for v in values if v is not None)


def solver_agreement(
    agent: Agent,
    files: Iterable[str] = AGREEMENT_FILES,
    limit: int | None = None,
    data_dir: str | Path | None = None,
    batch: int = 256,
) -> list[AgreementResult]:
    """Per file, how many of the agent's moves keep the position's perfect-play value. The
    agent is asked `batch` positions at a time (one batched search for a network agent)."""
    from .games.connect4 import Connect4, state_from_moves

    game = Connect4()
    results = []
    for name in files:
        states = [state_from_moves(game, m) for m in read_positions(name, data_dir, limit)]
        agreed = 0
        for i in range(0, len(states), batch):
            chunk = states[i : i + batch]
            for state, action in zip(chunk, act_many(agent, game, chunk), strict=True):
                agreed += keeps_value(state, int(action))
        results.append(AgreementResult(Path(name).name, len(states), agreed))
    return results


def agreement_table(results: list[AgreementResult], agent_name: str = "") -> str:
    total = AgreementResult("overall", sum(r.positions for r in results),
                            sum(r.agreed for r in results))
    lines = [f"solver agreement{' of ' + agent_name if agent_name else ''}",
             "| file | positions | keeps value | share |", "| --- | ---: | ---: | ---: |"]
    for r in [*results, total]:
        lines.append(f"| {r.file} | {r.positions} | {r.agreed} | {100 * r.share:.1f}% |")
    return "\n".join(lines)


# -- match audit (Connect Four) -------------------------------------------------------------


@dataclass
class GameAudit:
    """One game judged by perfect play, from agent A's side: +1 won, 0 drawn, -1 lost."""

    moves: str  # the game, columns 1-7, opening included
    start: int  # the position's value for A once the random opening is played
    result: int  # how the game ended for A
    a_errors: int  # A's moves that lowered A's value (win -> draw/loss, draw -> loss)
    b_errors: int  # the same for B

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def audit_game(record: GameRecord, solver: Any = None) -> GameAudit:
    """Solve every position of a Connect Four game after its opening and count, for each
    agent, the moves that changed the game's perfect-play outcome against it."""
    from .solver import Solver

    solver = solver or Solver()
    columns = "".join(str(m + 1) for m in record.moves)
    n, first = len(record.moves), len(record.opening)
    # value[k]: the first mover's perfect-play value after k moves. Solved from the end of
    # the game backwards so each solve finds its successors in the transposition table.
    value = {n: int(np.sign(record.outcome))}
    for k in range(n - 1, first - 1, -1):
        v = solver.solve(columns[:k], weak=True)  # the side to move's view
        value[k] = v if k % 2 == 0 else -v
    side = 1 if record.a_first else -1
    errors = [0, 0]  # A, B
    for k in range(first, n):
        mover = 1 if k % 2 == 0 else -1  # the first mover moves at even plies
        if mover * value[k + 1] < mover * value[k]:
            errors[0 if mover == side else 1] += 1
    return GameAudit(columns, side * value[first], side * value[n], errors[0], errors[1])


def audit_match(result: MatchResult, solver: Any = None,
                progress: Callable[[int, int], None] | None = None) -> list[GameAudit]:
    """`audit_game` for every game of a Connect Four match, sharing one solver (and its
    transposition table). Slow near the start: a position 2 plies deep takes ~1-5 min."""
    from .solver import Solver

    solver = solver or Solver(tt_bits=24)
    audits = []
    for i, record in enumerate(result.records):
        audits.append(audit_game(record, solver))
        if progress is not None:
            progress(i + 1, len(result.records))
    return audits


def audit_summary(audits: Sequence[GameAudit]) -> list[dict[str, Any]]:
    """Per value of the opening for A (won, drawn, lost): games, A's W/D/L and how many
    games had an outcome-changing move by A and by B."""
    rows = []
    for start, label in ((1, "won"), (0, "drawn"), (-1, "lost")):
        mine = [a for a in audits if a.start == start]
        rows.append({
            "opening_for_a": label, "games": len(mine),
            "wins": sum(a.result == 1 for a in mine), "draws": sum(a.result == 0 for a in mine),
            "losses": sum(a.result == -1 for a in mine),
            "games_a_erred": sum(a.a_errors > 0 for a in mine),
            "games_b_erred": sum(a.b_errors > 0 for a in mine),
        })
    return rows


def audit_table(audits: Sequence[GameAudit], a_name: str = "A", b_name: str = "B") -> str:
    lines = [f"perfect-play audit ({a_name} vs {b_name}): games by {a_name}'s value after the opening",
             f"| opening for {a_name} | games | W | D | L | games {a_name} erred | "
             f"games {b_name} erred |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in audit_summary(audits):
        lines.append(f"| {r['opening_for_a']} | {r['games']} | {r['wins']} | {r['draws']} | "
                     f"{r['losses']} | {r['games_a_erred']} | {r['games_b_erred']} |")
    return "\n".join(lines)
