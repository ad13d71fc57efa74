"""The package's shape: three layers importing one way, no import circle, small modules, one of each helper."""

from __future__ import annotations

import ast
import re

from conftest import REPO

KIT = REPO / "kit"
#: The core modules the engines' code (kit.train) may use: pure, no cluster machinery.
PURE_CORE = {"kit.core.errors", "kit.core.tfconfig", "kit.core.files"}


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(KIT.rglob("*.py")):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        found[name] = ast.parse(path.read_text(), str(path))
    return found


def imports(name: str, tree: ast.Module) -> set[str]:
    """Every kit module ``name`` imports, at the top or inside a function."""
    package = name if name.count(".") == 1 else name.rsplit(".", 1)[0]
    if name.endswith(("kit.core", "kit.train", "kit.tools")):
        package = name
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                out |= ({target} if node.module else set()) | {f"{target}.{a.name}" for a in node.names}
            elif node.module and node.module.startswith("kit"):
                out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("kit.")}
    return out


def pure(target: str) -> bool:
    return any(target == m or target.startswith(m + ".") for m in PURE_CORE)


def test_layers_import_one_way():
    wrong = []
    for name, tree in modules().items():
        for target in imports(name, tree):
            if name.startswith("kit.core") and target.startswith(("kit.train", "kit.tools")):
                wrong.append((name, target))
            if name.startswith("kit.train") and (target.startswith("kit.tools") or
                                                 target.startswith("kit.core.") and not pure(target)):
                wrong.append((name, target))
    assert not wrong


def test_no_import_circle_in_train_and_tools():
    graph = {name: imports(name, tree) for name, tree in modules().items()}
    circles = []

    def walk(node: str, path: list[str]) -> None:
        for target in graph.get(node, ()):
            if target in path:
                circles.append(path[path.index(target):] + [target])
            elif target.startswith(("kit.train.", "kit.tools.")):
                walk(target, path + [target])

    for name in graph:
        if name.startswith(("kit.train.", "kit.tools.")):
            walk(name, [name])
    assert not circles


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
