"""Draw the kit's modules and the imports between them, from the code, as the Mermaid diagram that opens
docs/architecture.md.

    python tools/module_graph.py           # rewrite the diagram in docs/architecture.md
    python tools/module_graph.py --check   # exit 1 if the diagram there is out of date

The import graph is read with an AST walk over ``kit/``: every import counts, at the top of a module or
inside a function (a lazy import is still a dependency, and still closes a circle). tests/test_layout.py
checks the layers and the circles on this same graph, and that the diagram in the document is the one
this script draws, so the picture cannot drift from the code.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
BEGIN = "<!-- module graph: drawn by tools/module_graph.py, checked by tests/test_layout.py -->"
END = "<!-- end of module graph -->"
#: The layers, in the order they import each other (each imports only those after it): their titles.
LAYERS = {"kit.tools": "kit.tools: tooling", "kit.train": "kit.train: code for the engines",
          "kit.core": "kit.core: the cluster"}
#: Modules that most modules of their layer import: drawn without those arrows (which would hide the rest).
EVERYWHERE = ("kit.core.errors", "kit.train._tf")


def modules(package: Path) -> dict[str, ast.Module]:
    """Every module of the package in folder ``package`` by dotted name (``kit.core.cluster``), parsed."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
        found[name] = ast.parse(path.read_text(), str(path))
    return found


def imports(name: str, tree: ast.Module, known: set[str], is_package: bool = False) -> set[str]:
    """The modules among ``known`` that module ``name`` imports, anywhere in it.

    ``from P import x`` counts as an import of ``P.x`` where that is a module, else of ``P``.
    """
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    found.add(f"{source}.{alias.name}")
                elif source in known:
                    found.add(source)
    return found - {name}


def graph(package: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports."""
    trees = modules(package)
    packages = {".".join(p.relative_to(package.parent).parts) for p in [package, *package.rglob("*")]
                if (p / "__init__.py").is_file()}
    return {name: imports(name, tree, set(trees), name in packages) for name, tree in trees.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, once each, as ``[a, b, ..., a]`` starting at its smallest name."""
    found: set[tuple[str, ...]] = set()

    def walk(node: str, path: list[str]) -> None:
        for target in sorted(edges.get(node, ())):
            if target == path[0]:
                found.add(tuple(path + [target]))
            elif target not in path and target > path[0]:  # each circle from its smallest module only
                walk(target, path + [target])

    for start in sorted(edges):
        walk(start, [start])
    return [list(circle) for circle in sorted(found)]


def _node(name: str) -> str:
    return name.replace(".", "_")


def _layer(name: str) -> str:
    return next((layer for layer in LAYERS if name.startswith(layer + ".")), "")


def mermaid(edges: dict[str, set[str]]) -> str:
    """The graph as a Mermaid flowchart: one box per layer holding its modules, an arrow for each import
    inside a layer, and one arrow from layer to layer naming the modules imported across.

    Arrows into the modules that most others import (:data:`EVERYWHERE`) are left out, their count put in
    the module's box instead: drawn, they would hide every other arrow. Package ``__init__`` modules are
    the boxes themselves.
    """
    inside = {name: {t for t in targets if _layer(t) == _layer(name)} for name, targets in edges.items()
              if _layer(name)}
    importers = {leaf: sum(leaf in targets for targets in inside.values()) for leaf in EVERYWHERE}
    lines = ["```mermaid", "flowchart TB"]
    for layer, title in LAYERS.items():
        lines.append(f'  subgraph {_node(layer)}["{title}"]')
        for name in sorted(n for n in inside if _layer(n) == layer):
            label = name.rpartition(".")[2]
            if name in EVERYWHERE:
                label += f" (imported by {importers[name]} modules of its layer)"
            lines.append(f'    {_node(name)}["{label}"]')
        lines.append("  end")
    for name in sorted(inside):
        for target in sorted(inside[name] - set(EVERYWHERE)):
            lines.append(f"  {_node(name)} --> {_node(target)}")
    across: dict[tuple[str, str], set[str]] = {}
    for name, targets in edges.items():
        for target in targets:
            if _layer(name) and _layer(target) and _layer(target) != _layer(name):
                across.setdefault((_layer(name), _layer(target)), set()).add(target.rpartition(".")[2])
    for (source, target), names in sorted(across.items()):
        lines.append(f'  {_node(source)} ==>|"{", ".join(sorted(names))}"| {_node(target)}')
    lines.append("```")
    return "\n".join(lines)


def render(text: str, edges: dict[str, set[str]]) -> str:
    """``text`` (docs/architecture.md) with the diagram between its markers drawn anew from ``edges``."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not (begin and end):
        raise SystemExit(f"{DOC.relative_to(REPO)} lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{mermaid(edges)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the diagram is out of date")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    drawn = render(text, graph(REPO / "kit"))
    if args.check:
        if drawn != text:
            print(f"{DOC.relative_to(REPO)}: the module graph is out of date; run python tools/module_graph.py",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(drawn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
