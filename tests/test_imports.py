"""The layering of docs/design.md, checked on the source: no import circle (module-level or
inside functions), `rlvr` and `zero` never import each other, `runtime` imports neither loop,
the simulator, the experiments nor the command line, the simulator imports neither loop nor
the experiments, and the command line (the `cli` package, the top layer, home of every
command) is imported by nothing outside it."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rlscale"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(module: str) -> set[str]:
    """The rlscale modules `module` imports anywhere in its source (lazy imports included)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        found |= {name for name in names if name in MODULES and name != module}
    return found


GRAPH = {module: imported(module) for module in MODULES}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_is_read():
    assert "rlscale.runtime.checkpoint" in GRAPH["rlscale.rlvr.loop"]
    assert "rlscale.zero.search" in GRAPH["rlscale.zero.selfplay"]


def test_no_import_circle():
    assert circles(GRAPH) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Every import of `graph` that points upwards, named with the rule it breaks."""
    broken = []
    for module, targets in graph.items():
        for target in targets:
            if under(module, "rlscale.rlvr") and under(target, "rlscale.zero") \
                    or under(module, "rlscale.zero") and under(target, "rlscale.rlvr"):
                broken.append(f"{module} -> {target} (the loops never import each other)")
            if under(module, "rlscale.runtime") and any(
                    under(target, f"rlscale.{upper}")
                    for upper in ("rlvr", "zero", "simulator", "experiments", "cli")):
                broken.append(f"{module} -> {target} (runtime is below both loops)")
            if under(module, "rlscale.simulator") and any(
                    under(target, f"rlscale.{upper}")
                    for upper in ("rlvr", "zero", "experiments", "cli")):
                broken.append(f"{module} -> {target} (the simulator models fleets, not loops)")
            if under(target, "rlscale.cli") and not under(module, "rlscale.cli"):
                broken.append(f"{module} -> {target} (nothing imports the command line)")
    return broken


def test_the_loops_and_the_runtime_keep_their_layers():
    assert layer_breaks(GRAPH) == []


def test_the_layer_check_catches_an_upward_import():
    graph = {"rlscale.rlvr.loop": {"rlscale.zero.mcts"}, "rlscale.zero.mcts": {"rlscale.rlvr.x"},
             "rlscale.runtime.fleet": {"rlscale.simulator"},
             "rlscale.experiments.runner": {"rlscale.cli.rlvr"},
             "rlscale.cli.rlvr": {"rlscale.cli.common", "rlscale.rlvr.loop"}}
    assert [line.split(" (")[0] for line in layer_breaks(graph)] == [
        "rlscale.rlvr.loop -> rlscale.zero.mcts", "rlscale.zero.mcts -> rlscale.rlvr.x",
        "rlscale.runtime.fleet -> rlscale.simulator",
        "rlscale.experiments.runner -> rlscale.cli.rlvr"]


def test_every_command_lives_in_the_cli_package():
    """The command line is one package: no command module is left elsewhere, and nothing
    outside the package builds a typer app."""
    gone = {"rlscale.zero.commands", "rlscale.zero.arena_cli", "rlscale.experiments.commands",
            "rlscale.runtime.simulate_cli", "rlscale.runtime.simulator", "rlscale.command_setup"}
    assert gone & set(MODULES) == set()
    outside = [name for name, path in MODULES.items()
               if not under(name, "rlscale.cli") and "typer.Typer(" in path.read_text()]
    assert outside == []
