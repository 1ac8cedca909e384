"""Every concrete `rlscale ...` command in README.md's bash blocks parses against the real CLI.

Nothing is run: each line goes through click's own parsing (`make_context`) from the top
group down to its command, so a renamed command, subcommand or option, or an argument the
command does not take, fails here and names the README line. Synopsis lines (`[...]`,
`a|b`, `...`, ALL-CAPS placeholders such as DIR or CONFIG) and lines with shell redirections
are left out; every `configs/...yaml` the kept lines name must exist.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from rlscale.cli import app

# click's exception classes as typer raises them: typer >= 0.2x carries its own copy of click,
# older ones use click itself; typer.BadParameter is public in both.
ClickException, UsageError = (
    next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)
    for name in ("ClickException", "UsageError"))

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

BASH_BLOCK = re.compile(r"^```bash[ \t]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")  # DIR, PATH, CONFIG, NAME, RUN_DIR, FILE, A, B, N
SHELL_OPERATORS = ("<", ">", "|", "&", ";")
CONFIG_PATH = re.compile(r"configs/[\w./-]+\.ya?ml")


def _logical_lines(block: str) -> list[tuple[int, str]]:
    """(index of its first line in the block, line) with backslash continuations joined."""
    lines, pending, start = [], "", 0
    for i, raw in enumerate(block.splitlines()):
        line = raw.rstrip()
        if not pending:
            start = i
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    if pending:
        lines.append((start, pending))
    return lines


def _tokens(line: str) -> list[str] | None:
    """The line's words without its trailing `# comment`, or None for a synopsis line or
    one with shell redirections, pipes or several commands."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    if any(t and t[0] in SHELL_OPERATORS for t in tokens):
        return None  # `< positions.txt`, `> out`, `| tee`, `&&`, ...
    code = shlex.join(tokens)
    if "[" in code or "..." in code or any("|" in t for t in tokens):
        return None  # a synopsis: optional parts, repeats or alternatives
    for token in tokens:
        for part in token.split("="):  # key=VALUE as well as a bare VALUE
            if PLACEHOLDER.fullmatch(part):
                return None
    return tokens


def readme_commands() -> list[tuple[int, str, list[str]]]:
    """(line number, README line, argv after `rlscale`) for every concrete command."""
    text = README.read_text(encoding="utf-8")
    found = []
    for block in BASH_BLOCK.finditer(text):
        first_line = text.count("\n", 0, block.start(1)) + 1
        for index, line in _logical_lines(block.group(1)):
            if not line.startswith("rlscale "):
                continue
            tokens = _tokens(line)
            if tokens is not None:
                found.append((first_line + index, " ".join(line.split()), tokens[1:]))
    return found


COMMANDS = readme_commands()


def _rest(ctx) -> list[str]:
    """What a group's context left for its subcommand (its name first)."""
    protected = ctx.__dict__.get("_protected_args")  # click >= 8.2 (and typer's own copy)
    if protected is None:
        protected = ctx.protected_args
    return [*protected, *ctx.args]


def parse(argv: list[str]) -> list[str]:
    """Parse `rlscale ARGV` down to its command without invoking anything; the command path
    (e.g. ['rlscale', 'zero', 'train']). Raises click's UsageError on anything unknown."""
    ctx = typer.main.get_command(app).make_context("rlscale", list(argv),
                                                   resilient_parsing=False)
    path = ["rlscale"]
    while hasattr(ctx.command, "resolve_command"):  # a group: descend to its subcommand
        rest = _rest(ctx)
        if not rest:
            raise UsageError(f"{' '.join(path)} needs a command", ctx)
        name, sub, args = ctx.command.resolve_command(ctx, rest)
        if sub is None:  # click raises for an unknown name; be explicit all the same
            raise UsageError(f"no such command {rest[0]!r} under {' '.join(path)}", ctx)
        path.append(name)
        ctx = sub.make_context(name, args, parent=ctx, resilient_parsing=False)
    if ctx.args:
        raise UsageError(f"unexpected extra arguments {ctx.args}", ctx)
    return path


def test_the_readme_has_commands_to_check():
    assert len(COMMANDS) >= 15, [line for _, line, _ in COMMANDS]
    names = {" ".join(argv[:2]) for _, _, argv in COMMANDS}
    for expected in ("zero train", "zero arena", "rlvr train", "rlvr eval", "experiments run"):
        assert expected in names, f"no README command for `rlscale {expected}`: {sorted(names)}"


@pytest.mark.parametrize(("lineno", "line", "argv"), COMMANDS,
                         ids=[f"README:{n}" for n, _, _ in COMMANDS])
def test_readme_command_parses(lineno, line, argv):
    try:
        path = parse(argv)
    except typer.Exit as stop:  # an eager option such as --version exits while parsing
        assert stop.exit_code == 0, f"README.md:{lineno}: `{line}` exited {stop.exit_code}"
        return
    except ClickException as exc:
        pytest.fail(f"README.md:{lineno}: `{line}` does not parse: {exc.format_message()}")
    assert len(path) >= 2, (lineno, line, path)


@pytest.mark.parametrize(("lineno", "line", "argv"), COMMANDS,
                         ids=[f"README:{n}" for n, _, _ in COMMANDS])
def test_readme_config_paths_exist(lineno, line, argv):
    for path in CONFIG_PATH.findall(" ".join(argv)):
        assert (REPO / path).is_file(), f"README.md:{lineno}: `{line}` names missing {path}"


@pytest.mark.parametrize(("argv", "wrong"), [
    (["zero", "trian", "configs/zero/tictactoe.yaml"], "trian"),
    (["zero", "arena", "--oponent", "raw"], "--oponent"),
    (["rlvr", "eval", "--model", "m", "--task", "arithmetic", "--sample", "4"], "--sample"),
    (["rlvr", "train"], "config"),
    (["zero", "move", "--moves", "4453", "extra"], "extra"),
])
def test_the_check_catches_a_renamed_command_or_option(argv, wrong):
    with pytest.raises(ClickException) as caught:
        parse(argv)
    assert wrong.lower() in caught.value.format_message().lower()


def test_synopsis_and_redirection_lines_are_left_out():
    assert _tokens("rlscale quickstart [arithmetic|reasoning] [--out DIR] [--tiny]") is None
    assert _tokens("rlscale zero move --game connect4 --moves - < positions.txt") is None
    assert _tokens("rlscale sft CONFIG") is None
    assert _tokens("rlscale zero elo-curve RUN_DIR --games 30") is None
    assert _tokens("rlscale zero ...   # the loop") is None
    assert _tokens("rlscale zero arena --opponent 'gtp:/usr/games/gnugo --mode gtp'  # x") == [
        "rlscale", "zero", "arena", "--opponent", "gtp:/usr/games/gnugo --mode gtp"]
    joined = _logical_lines("rlscale a \\\n    b\nrlscale c")
    assert [(i, " ".join(line.split())) for i, line in joined] == [(0, "rlscale a b"),
                                                                   (2, "rlscale c")]
