"""The import graph of qcli/ and benchmarks/: no cycles, data flowing one way through the
stages (DESIGN's architecture), typer only in the CLI. Every import counts, at module level,
inside a function or under TYPE_CHECKING: a lazy import in a loop is still a loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The pipeline's stages in the order data flows (model -> prepare -> calibrate -> plan -> qdq ->
#: analyze), then what drives them: a module may import its own stage or an earlier one.
STAGES = ("qcli.prepare", "qcli.calibrate", "qcli.plan", "qcli.qdq", "qcli.analyze", "qcli.precision",
          "qcli.verify", "qcli.commands", "qcli.cli")
#: The only modules that import typer (the command line).
TYPER = {"qcli.cli", "qcli.clihelp", "qcli.cliparts"}


def modules(package: str) -> dict[str, Path]:
    """Dotted name -> file of every module under `package` (a package is its __init__)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path) -> set[str]:
    """Every dotted name `path` imports, relative imports resolved (`from a import b`: `a.b`,
    which is module `a.b` when there is one, else a name of module `a`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def graph(*packages: str) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports (a name resolves to its longest module)."""
    mods = {k: v for p in packages for k, v in modules(p).items()}

    def owner(dotted: str, path: Path) -> str | None:
        folder = path.parent.relative_to(ROOT).parts
        if not (path.parent / "__init__.py").exists() and ".".join([*folder, dotted.split(".")[0]]) in mods:
            dotted = ".".join([*folder, dotted])  # a script's sibling, imported by its bare name
        while dotted and dotted not in mods:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    return {m: {o for n in imported(m, p) if (o := owner(n, p)) and o != m} for m, p in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each import loop once, as the path that closes it (depth first, sorted: deterministic)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []
    found = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                found.append([*stack[stack.index(n):], n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return found


def stage(module: str) -> int | None:
    return next((i for i, s in enumerate(STAGES) if module == s or module.startswith(s + ".")), None)


def test_the_cycle_finder_finds_a_loop_and_passes_a_tree() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("packages", [("qcli",), ("benchmarks", "qcli")])
def test_no_import_cycles(packages: tuple[str, ...]) -> None:
    loops = cycles(graph(*packages))
    assert not loops, "import cycles (move what both sides need down, or invert one):\n" + "\n".join(
        " -> ".join(loop) for loop in loops)


def test_data_flows_one_way_through_the_stages() -> None:
    upward = [f"{m} -> {n}" for m, outs in graph("qcli").items() for n in sorted(outs)
              if (a := stage(m)) is not None and (b := stage(n)) is not None and b > a]
    assert not upward, "imports from a stage into a later one (" + " < ".join(STAGES) + "):\n" + "\n".join(upward)


def test_only_the_command_line_imports_typer() -> None:
    users = sorted(m for m, p in modules("qcli").items() if any(n.split(".")[0] == "typer" for n in imported(m, p)))
    assert set(users) <= TYPER, f"typer imported outside the command line: {sorted(set(users) - TYPER)}"
