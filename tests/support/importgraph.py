"""The import graph of a package tree, and its circles (docs/architecture.md, "The
cluster's import graph").

    python -m tests.support.importgraph brokerd/cluster [--typing] [--edges]

``--typing`` counts the imports under ``if TYPE_CHECKING:`` too (a circle there is
one of names, not of loading); ``--edges`` lists every module's imports. Circles
are the strongly connected components of more than one module (Tarjan).
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterable
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(body: Iterable[ast.stmt], known: dict[str, Path], me: str, typing: bool) -> set[str]:
    """The known modules a module's statements import (nested blocks included)."""
    out: set[str] = set()
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not typing:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            for name in [node.module, *(f"{node.module}.{a.name}" for a in node.names)]:
                if name in known and name != me:
                    out.add(name)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known and a.name != me}
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                out |= imports(inner, known, me, typing)
    return out


def graph(root: Path, typing: bool) -> dict[str, set[str]]:
    known = modules(root)
    return {m: imports(ast.parse(p.read_text()).body, known, m, typing) for m, p in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--typing", action="store_true", help="count TYPE_CHECKING imports")
    parser.add_argument("--edges", action="store_true", help="list every module's imports")
    args = parser.parse_args()
    edges = graph(args.root, args.typing)
    prefix = ".".join(args.root.parts) + "."
    short = lambda m: m.removeprefix(prefix)  # noqa: E731
    print(f"modules {len(edges)}, imports {sum(map(len, edges.values()))}")
    for component in circles(edges):
        print(f"circle ({len(component)}): {', '.join(map(short, component))}")
    if args.edges:
        for m in sorted(edges):
            if edges[m]:
                print(short(m), "->", ", ".join(sorted(map(short, edges[m]))))


if __name__ == "__main__":
    main()
