"""Go game records in SGF (FF[4]): write one, and read back the main line of a simple one.

Moves are actions of `rlscale.zero.games.go` (`row * size + col`, row 0 at the top, pass =
size * size). SGF points are two letters, column then row, `a` at the top-left, which is
the same orientation; a pass is written `B[]`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .. import __version__

_COLOURS = "BW"


@dataclass
class SgfGame:
    size: int
    komi: float
    moves: list[tuple[int, int]]  # (player 0 black / 1 white, action)
    result: str | None = None
    black: str = ""
    white: str = ""
    properties: dict[str, str] = field(default_factory=dict)  # every root property


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("]", "\\]")


def _point(size: int, action: int) -> str:
    if action == size * size:
        return ""
    if not 0 <= action < size * size:
        raise ValueError(f"action {action} is not on a {size}x{size} board")
    row, col = divmod(action, size)
    return chr(ord("a") + col) + chr(ord("a") + row)


def to_sgf(
    size: int,
    komi: float,
    moves: Iterable[int | tuple[int, int]],
    result: str | None = None,
    black: str = "",
    white: str = "",
    rules: str = "Chinese",  # area scoring, positional superko, no suicide: ours
    comment: str = "",
) -> str:
    """SGF text of a game. `moves` are actions alternating from black, or
    (player, action) pairs when a colour may move twice."""
    root = [f"GM[1]FF[4]CA[UTF-8]AP[rlscale:{__version__}]SZ[{size}]KM[{komi:g}]"]
    root.append(f"RU[{_escape(rules)}]")
    for key, value in (("PB", black), ("PW", white), ("RE", result), ("C", comment)):
        if value:
            root.append(f"{key}[{_escape(value)}]")
    nodes = ["(;" + "".join(root)]
    for i, move in enumerate(moves):
        player, action = move if isinstance(move, tuple) else (i % 2, move)
        nodes.append(f";{_COLOURS[player]}[{_point(size, action)}]")
    # A line break every 10 moves keeps records readable and never splits a value.
    lines = [nodes[0]] + ["".join(nodes[i : i + 10]) for i in range(1, len(nodes), 10)]
    return "\n".join(lines) + ")\n"


def write_sgf(path, *args, **kwargs) -> None:
    """`to_sgf(*args, **kwargs)` written to `path`."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_sgf(*args, **kwargs))


# ---------------------------------------------------------------------------- reading


def _parse_nodes(text: str) -> list[list[tuple[str, list[str]]]]:
    """The main line (first variation everywhere) as nodes of (property, values)."""
    pos = 0
    n = len(text)

    def skip_space() -> None:
        nonlocal pos
        while pos < n and text[pos].isspace():
            pos += 1

    def value() -> str:
        nonlocal pos
        pos += 1  # "["
        out = []
        while pos < n and text[pos] != "]":
            if text[pos] == "\\" and pos + 1 < n:
                pos += 1
                if text[pos] in "\r\n":  # soft line break
                    pos += 1
                    continue
            out.append(text[pos])
            pos += 1
        if pos >= n:
            raise ValueError("SGF value is not closed by ]")
        pos += 1
        return "".join(out)

    def node() -> list[tuple[str, list[str]]]:
        nonlocal pos
        pos += 1  # ";"
        props = []
        while True:
            skip_space()
            start = pos
            while pos < n and text[pos].isalpha():
                pos += 1
            ident = "".join(ch for ch in text[start:pos] if ch.isupper())
            if not ident:
                return props
            values = []
            skip_space()
            while pos < n and text[pos] == "[":
                values.append(value())
                skip_space()
            if not values:
                raise ValueError(f"SGF property {ident} has no value")
            props.append((ident, values))

    def tree() -> list[list[tuple[str, list[str]]]]:
        nonlocal pos
        skip_space()
        if pos >= n or text[pos] != "(":
            raise ValueError("SGF game tree must start with (")
        pos += 1
        nodes = []
        skip_space()
        while pos < n and text[pos] == ";":
            nodes.append(node())
            skip_space()
        first = True
        while pos < n and text[pos] == "(":
            child = tree()
            if first:
                nodes.extend(child)
                first = False
            skip_space()
        if pos >= n or text[pos] != ")":
            raise ValueError("SGF game tree is not closed by )")
        pos += 1
        return nodes

    return tree()


def from_sgf(text: str) -> SgfGame:
    """Size, komi, result, players and main-line moves of an SGF Go record."""
    nodes = _parse_nodes(text)
    if not nodes:
        raise ValueError("SGF has no nodes")
    root = {ident: values[0] for ident, values in nodes[0]}
    if root.get("GM", "1") != "1":
        raise ValueError(f"SGF game type GM[{root['GM']}] is not Go")
    size = int(root.get("SZ", "19").split(":")[0])
    komi = float(root.get("KM", "0") or 0)
    moves: list[tuple[int, int]] = []
    for props in nodes:
        for ident, values in props:
            if ident in ("AB", "AW", "AE"):
                raise ValueError("SGF setup stones (AB/AW/AE) are not supported")
            if ident in ("B", "W"):
                moves.append((_COLOURS.index(ident), _action(size, values[0])))
    return SgfGame(
        size=size, komi=komi, moves=moves, result=root.get("RE"),
        black=root.get("PB", ""), white=root.get("PW", ""), properties=root,
    )


def _action(size: int, point: str) -> int:
    if point == "" or (point == "tt" and size <= 19):
        return size * size
    if len(point) != 2:
        raise ValueError(f"bad SGF point {point!r}")
    col, row = ord(point[0]) - ord("a"), ord(point[1]) - ord("a")
    if not (0 <= col < size and 0 <= row < size):
        raise ValueError(f"SGF point {point!r} is off the {size}x{size} board")
    return row * size + col


def replay(game, moves: Sequence[tuple[int, int]]):
    """States of `game` (a Go game) after each of `moves`, the initial state first."""
    states = [game.initial_state()]
    for player, action in moves:
        state = game.set_to_play(states[-1], player)
        states.append(game.apply(state, action))
    return states
