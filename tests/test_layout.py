"""The package's shape: three layers importing one way, no import circle, no reach into another object's
private state, small modules, one of each helper, and the module graph of docs/architecture.md drawn from
the code."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from conftest import REPO

KIT = REPO / "kit"
#: The core modules the engines' code (kit.train) may use: pure, no cluster machinery.
PURE_CORE = {"kit.core.errors", "kit.core.tfconfig", "kit.core.files"}
#: Where no module reads another object's underscored attribute. kit.train is left out: it reads a few
#: of TensorFlow's private fields where TensorFlow has no public one (e.g. a strategy's worker count).
NO_PRIVATE_REACH = ("core", "tools")
#: Underscored names of the standard library that are its public API.
STDLIB_PRIVATE_API = {("os", "_exit"), ("sys", "_getframe")}


def module_graph():
    """tools/module_graph.py: the import graph (an AST walk) that the diagram of docs/architecture.md shows."""
    spec = importlib.util.spec_from_file_location("module_graph", REPO / "tools" / "module_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def private_reaches(package: Path) -> list[str]:
    """Every ``x._name`` in the package's modules where ``x`` is not ``self`` or ``cls`` (dunders aside), and
    every ``from m import _name`` of something that is not a module of the package: ``path:line: code``."""
    known = set(module_graph().modules(package))
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if owner in ("self", "cls") or (owner, node.attr) in STDLIB_PRIVATE_API:
                    continue
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom):
                base = module.rsplit(".", node.level)[0] if node.level else ""
                source = ".".join(filter(None, [base, node.module]))
                for alias in node.names:
                    if alias.name.startswith("_") and f"{source}.{alias.name}" not in known:
                        found.append(f"{path.relative_to(package.parent)}:{node.lineno}: from {source} import {alias.name}")
    return found


def write_package(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_layers_import_one_way():
    wrong = []
    for name, targets in module_graph().graph(KIT).items():
        for target in targets:
            if name.startswith("kit.core") and target.startswith(("kit.train", "kit.tools")):
                wrong.append((name, target))
            if name.startswith("kit.train") and (target.startswith("kit.tools") or
                                                 target.startswith("kit.core.") and target not in PURE_CORE):
                wrong.append((name, target))
    assert not wrong


def test_no_import_circle_anywhere_in_kit():
    """Lazy imports inside functions count: a circle through one still ties the two modules together."""
    circles = module_graph().circles(module_graph().graph(KIT))
    assert not circles


def test_no_module_reads_another_objects_private_state():
    """A run talks to its cluster, a cluster to its engines, through public names (kit.core.group.TaskGroup,
    kit.core.engines.Engines): whoever changes one file's private state need not read the others."""
    reaches = [r for folder in NO_PRIVATE_REACH for r in private_reaches(KIT / folder)]
    assert not reaches


def test_the_checks_find_a_circle_even_through_a_lazy_import(tmp_path):
    tool = module_graph()
    package = write_package(tmp_path / "pkg", {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def later():\n    from .a import something\n",
        "c.py": "from .a import something\nimport pkg.sub.d\n",
        "sub/__init__.py": "",
        "sub/d.py": "from .. import c\n",
    })
    assert tool.circles(tool.graph(package)) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.c", "pkg.sub.d", "pkg.c"]]
    (package / "b.py").write_text("def later():\n    return 1\n")
    (package / "sub" / "d.py").write_text("import os\n")
    assert tool.circles(tool.graph(package)) == []


def test_the_checks_find_a_private_reach(tmp_path):
    package = write_package(tmp_path / "pkg", {
        "__init__.py": "",
        "_helper.py": "def _hidden():\n    return 1\n",
        "run.py": ("import os, sys\nfrom . import _helper\nfrom ._helper import _hidden\n\n"
                   "class Run:\n    def go(self, cluster):\n        self._count = sys._getframe(0).f_lineno\n"
                   "        if cluster._records:\n            os._exit(1)\n        return cluster.__class__\n"),
    })
    assert private_reaches(package) == ["pkg/run.py:3: from pkg._helper import _hidden",
                                        "pkg/run.py:8: cluster._records"]
    (package / "run.py").write_text("from . import _helper\n\ndef go(cluster):\n    return cluster.records\n")
    assert private_reaches(package) == []


def test_the_module_graph_in_architecture_md_is_drawn_from_the_code():
    tool = module_graph()
    text = (REPO / "docs" / "architecture.md").read_text()
    assert text.startswith("# Architecture\n") and text.index(tool.BEGIN) < text.index("\n## ")
    assert text == tool.render(text, tool.graph(KIT)), \
        "docs/architecture.md's module graph is out of date: run python tools/module_graph.py"


def test_no_module_is_over_400_lines():
    sizes = {p.relative_to(REPO).as_posix(): len(p.read_text().splitlines()) for p in KIT.rglob("*.py")}
    assert sizes and not {p: n for p, n in sizes.items() if n > 400}


def test_one_of_each_helper():
    text = {p.relative_to(REPO).as_posix(): p.read_text() for p in KIT.rglob("*.py")}

    def where(pattern: str) -> set[str]:
        return {p for p, t in text.items() if re.search(pattern, t, re.MULTILINE)}

    # the task name: only tfconfig reads KIT_TASK (the cluster sets it on the engines it starts)
    assert where(r"environ(\.get)?[\[(]\s*[\"']KIT_TASK") == set()
    assert where(r"^def this_task\(") == {"kit/core/tfconfig.py"}
    assert where(r"\.savefig\(") == {"kit/core/files.py"}
    assert where(r"os\.replace\(|\.replace\((partial|target)") == {"kit/core/files.py"}
    assert where(r"def (make|build)_strategy\(") == {"kit/train/strategies.py"}
    assert where(r"^STRATEGIES = ") == {"kit/train/strategies.py"}
    assert where(r"def per_step_losses\(|running_means") <= {"kit/train/scaling.py"}
    assert where(r"def first_line\(") == {"kit/core/errors.py"}
    # tf-keras sums per-batch logs over the replicas: one fix, kit.train.progress.summed_replicas
    assert where(r"def summed_replicas\(") == {"kit/train/progress.py"}
    assert where(r"summed_over=") == set()
    # one of each process mechanism: free ports in kit.core.tfconfig; "does it run" and kill-and-reap in
    # kit.core._lifeline (runs, reap), which every module that ends processes calls
    assert where(r"getsockname\(\)\[1\]") == {"kit/core/tfconfig.py"}
    assert where(r"\.is_running\(\)") == {"kit/core/_lifeline.py"}
    assert where(r"wait_procs\(") == set()
    assert where(r"os\.waitpid\(") == {"kit/core/_lifeline.py", "kit/core/_zygote.py"}  # the zygote: its forks


def test_engine_side_validation_raises_the_kits_errors():
    bare = []
    for path in [*KIT.joinpath("train").glob("*.py"), *KIT.joinpath("tools").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                    getattr(node.exc.func, "id", "") in ("ValueError", "TypeError", "RuntimeError"):
                bare.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bare


def test_every_cluster_error_says_its_own_fix():
    """A ClusterError or KitError raised in kit passes ``fix=`` or writes "Fix:" in its message, so ``.fix``
    is specific. The start-up errors that quote an engine's log are the exception: their fix is the class's
    ("read the engine log lines the message quotes, ...")."""
    general = []
    for path in KIT.rglob("*.py"):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and getattr(node.exc.func, "id", "") in ("ClusterError", "KitError")):
                continue
            call = ast.get_source_segment(source, node.exc)
            if any(k.arg == "fix" for k in node.exc.keywords) or "Fix" in call or "_FIX" in call \
                    or "log_tail(" in call:
                continue
            general.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not general


def layer_table() -> dict[str, set[str]]:
    """The modules docs/architecture.md's table "Three layers" names for each layer: in its last column, the
    entries separated by commas outside parentheses, each opening with its module's name (or names, joined by /)
    in backticks."""
    rows = {}
    for line in (REPO / "docs" / "architecture.md").read_text().splitlines():
        found = re.match(r"\| `(kit\.\w+)`: ", line)
        if not found:
            continue
        entries, depth, current = [], 0, ""
        for char in line.rstrip(" |").rsplit(" | ", 1)[1]:
            depth += {"(": 1, ")": -1}.get(char, 0)
            if char == "," and depth == 0:
                entries, current = entries + [current], ""
            else:
                current += char
        names = set()
        for entry in entries + [current]:
            head = re.match(r"((?:`[\w.]+`/?)+)", re.sub(r"^(and the recipes:|and)\s*", "", entry.strip()))
            assert head, f"docs/architecture.md, row {found[1]}: the entry {entry.strip()[:60]!r} names no module first"
            names |= set(re.findall(r"`([\w.]+)`", head[1]))
        rows[found[1]] = names
    return rows


def test_the_layer_table_names_every_module_of_its_layer_and_no_other():
    table = layer_table()
    graph = module_graph().modules(KIT)
    assert sorted(table) == ["kit.core", "kit.tools", "kit.train"], f"docs/architecture.md's layers: {sorted(table)}"
    for layer, named in table.items():
        modules = {name.rsplit(".", 1)[1] for name in graph if name.rsplit(".", 1)[0] == layer}  # not subpackages
        modules |= {path.name for path in (KIT / layer.split(".")[1]).glob("*.sh")}
        assert named == modules, (f"docs/architecture.md's row for {layer}: missing {sorted(modules - named)}, "
                                  f"not in the code {sorted(named - modules)}. Fix: describe each module in its row")
