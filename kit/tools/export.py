"""``kit export``: a lesson's code as the learner's own ``main.py``, which runs without the kit.

A notebook marks its lesson with cell tags and one metadata entry:

- cells tagged ``lesson`` are the script, in order (imports, data, model, the training function);
  a ``lesson`` cell that starts with ``%%writefile NAME`` is written beside ``main.py`` as ``NAME``
  (e.g. Horovod's host-discovery script), not into it;
- ``metadata.kit.export`` says what the script runs::

      "export": {"call": "train",                       # the lesson function main() calls
                 "arguments": {"epochs": "EPOCHS"},     # its parameters set on the command line, each
                                                        # defaulting to a variable of the parameters cell
                 "keras": "tf_keras",                   # or "keras3": which Keras the script asks for
                 "help": {"run_dir": "storage every worker shares ..."},   # an option's --help sentence
                 "run": "TF_CONFIG='{...}' python main.py"}   # how a cluster runs it (shown in the script)

The script reads ``TF_CONFIG`` (or Horovod's, or Slurm's environment) itself, as any job does, and prints
the training function's result as one line of JSON at the end. It never imports ``kit``:
:func:`check_lesson` refuses a lesson that names it.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path
from typing import Any

from ..core.errors import KitError
from ..core.files import shipped

LESSON_TAG = "lesson"
#: What a lesson's code must not use: the kit itself, the kit's own environment, TensorFlow's and
#: tf-keras's private attributes (a learner's script has none of them).
FORBIDDEN = {
    "kit": "the kit (a learner's script runs without it): pass what the kit measures in as an argument "
           "(callbacks=[kit.Progress(...)]) or read it in a cell outside the lesson",
    "KIT_": "the kit's environment variables (KIT_TASK ...): read TF_CONFIG, as a script does",
}
#: The lesson ``kit demo`` runs; every installed kit has it, so its folder is the lessons' folder.
DEMO_NOTEBOOK = "01-single-vs-multi-worker.ipynb"
#: Names with a leading underscore that are public API all the same (the standard library documents them).
PUBLIC_UNDERSCORED = {"os._exit", "sys._getframe"}
_WRITEFILE = re.compile(r"\A%%writefile(?:\s+-a)?\s+(\S+)\s*\n")


class ExportError(KitError):
    """A notebook that cannot be exported, with the field and the fix."""


def notebooks_dir() -> Path:
    """The folder of the lessons: ``kit/notebooks`` in an installed wheel (package data), else the
    repository's ``notebooks/`` (an editable install, or kit imported from a checkout)."""
    found = shipped("notebooks", DEMO_NOTEBOOK)
    if found is None:
        raise KitError(f"the lessons are in neither kit/notebooks (an installed kit) nor notebooks/ (a checkout) "
                       f"beside {Path(__file__).resolve().parents[1]}. Fix: git checkout notebooks/ in a checkout, or "
                       "reinstall the kit (pip install --force-reinstall WHEEL_OR_SOURCE_FOLDER)")
    return found


def lesson_cells(notebook: dict) -> list[str]:
    """The sources of the cells tagged ``lesson``, in order."""
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in notebook["cells"]
            if c["cell_type"] == "code" and LESSON_TAG in c.get("metadata", {}).get("tags", [])]


def check_lesson(name: str, sources: list[str]) -> list[str]:
    """What in the lesson's code a script could not have (empty when it is plain): a use of ``kit``, of the
    kit's environment variables, or a private attribute (``obj._name``)."""
    problems = []
    for source in sources:
        if _WRITEFILE.match(source):
            continue
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "kit":
                problems.append(f"{name}: line {node.lineno} uses {FORBIDDEN['kit']}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(m == "kit" or m.startswith("kit.") for m in modules):
                    problems.append(f"{name}: line {node.lineno} imports {FORBIDDEN['kit']}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("KIT_"):
                problems.append(f"{name}: line {node.lineno} reads {node.value!r}, {FORBIDDEN['KIT_']}")
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                  and not (isinstance(node.value, ast.Name) and node.value.id == "self")
                  and ast.unparse(node) not in PUBLIC_UNDERSCORED):
                problems.append(f"{name}: line {node.lineno} reads the private attribute .{node.attr} "
                                "(a script should use public API only)")
    return problems


def parameters(notebook: dict) -> dict[str, Any]:
    """The values of the cell tagged ``parameters`` (literal assignments, as papermill needs them)."""
    for cell in notebook["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            values = {}
            for node in ast.parse("".join(cell["source"])).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    try:
                        values[node.targets[0].id] = ast.literal_eval(node.value)
                    except ValueError:
                        continue  # not a literal: not a command-line default
            return values
    return {}


def _option(name: str, default: Any, sentence: str | None = None) -> str:
    """The argparse line of one option; a default of None or of a list takes any Python literal (``--seed 1`` is
    the number 1, ``--path x.npz`` stays text). ``sentence``: what ``--help`` says of it (then its default)."""
    flag = "--" + name.replace("_", "-")
    text = f",\n                        help={sentence.replace('%', '%%') + ' (default: %(default)s)'!r}" if sentence else ""
    if isinstance(default, bool):
        return f"    parser.add_argument({flag!r}, action=argparse.BooleanOptionalAction, default={default!r}{text})"
    kind = {int: "int", float: "float", str: "str"}.get(type(default), "literal")
    return f"    parser.add_argument({flag!r}, type={kind}, default={default!r}{text})"


def script(notebook: dict, name: str) -> tuple[str, dict[str, str]]:
    """``main.py``'s text and the files beside it, from ``notebook`` (its file name ``name``)."""
    spec = notebook.get("metadata", {}).get("kit", {}).get("export")
    if not spec:
        raise ExportError(f"{name} has no metadata.kit.export: it is not a lesson that trains. Fix: export "
                          "one of the notebooks `kit export --list` names")
    sources = lesson_cells(notebook)
    if not sources:
        raise ExportError(f"{name}: no cell is tagged {LESSON_TAG!r}. Fix: tag the cells of the lesson's code")
    problems = check_lesson(name, sources)
    if problems:
        raise ExportError("the lesson's code is not a plain script:\n  " + "\n  ".join(problems) +
                          "\nFix: move what the kit does out of the cells tagged 'lesson'")
    call, run = spec.get("call"), spec.get("run", "python main.py")
    values = parameters(notebook)
    arguments = spec.get("arguments", {})
    missing = [v for v in arguments.values() if v not in values]
    if missing:
        raise ExportError(f"{name}: metadata.kit.export.arguments names {missing}, which the parameters cell "
                          "does not set to a literal. Fix: name variables of the cell tagged 'parameters'")
    helps = spec.get("help", {})
    strays = sorted(set(helps) - set(arguments))
    if strays:
        raise ExportError(f"{name}: metadata.kit.export.help names {strays}, which are not among its arguments. "
                          "Fix: give help only for options of metadata.kit.export.arguments")
    files, body = {}, []
    for source in sources:
        match = _WRITEFILE.match(source)
        if match:
            files[match.group(1)] = source[match.end():]
        else:
            body.append(source.strip("\n"))
    if call is None or not any(re.search(rf"^def {re.escape(call)}\(", s, re.M) for s in body):
        raise ExportError(f"{name}: metadata.kit.export.call is {call!r}, which no lesson cell defines. "
                          "Fix: name the training function of a cell tagged 'lesson'")
    body = reachable(body, call)
    title = next((("".join(c["source"]).splitlines() or [""])[0].lstrip("# ").strip()
                  for c in notebook["cells"] if c["cell_type"] == "markdown"), name)
    keras = spec.get("keras", "tf_keras")
    header = [
        f'"""{title}',
        "",
        f"The lesson's code of {name} (its cells tagged '{LESSON_TAG}'), written out by `kit export`.",
        "It runs without the kit; run one process per task of the cluster, e.g.:",
        "",
        *("    " + line for line in run.splitlines()),
        "",
        "Its options (`python main.py --help`) default to the notebook's parameters. At the end it prints the",
        f"result of {call}() as one line of JSON.",
        '"""',
        "",
    ]
    if keras == "tf_keras":
        header += ["import os", "",
                   "# tf-keras (Keras 2), as in the notebook: TensorFlow 2.21's own tf.keras is Keras 3, whose fit fails",
                   "# under MultiWorkerMirroredStrategy (keras-team/keras#20585). Needs `pip install tf-keras`; it must be",
                   "# set before TensorFlow is imported.",
                   'os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")', ""]
    options = [_option(arg, values[var], helps.get(arg)) for arg, var in arguments.items()]
    main = [
        "",
        "def literal(text):",
        '    """A command-line value as the Python literal it spells (1, 0.5, [64, 128], None), else as text."""',
        "    import ast",
        "    try:",
        "        return ast.literal_eval(text)",
        "    except (ValueError, SyntaxError):",
        "        return text",
        "",
        "",
        "def main(argv=None):",
        "    import argparse",
        "    import json",
        f"    parser = argparse.ArgumentParser(description={title!r})",
        *options,
        "    args = parser.parse_args(argv)",
        f"    result = {call}(**vars(args))",
        "    print(json.dumps(result, default=lambda value: value.tolist() if hasattr(value, 'tolist') else str(value)))",
        "",
        "",
        'if __name__ == "__main__":',
        "    main()",
    ]
    text = "\n".join(header) + "\n" + "\n\n\n".join(body) + "\n\n" + "\n".join(main) + "\n"
    ast.parse(text)  # a lesson that does not parse fails here, not on the cluster
    return text, files


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def unreachable(sources: list[str], call: str) -> list[str]:
    """The top-level functions and classes of ``sources`` that neither ``call`` (what main() runs) nor the module's
    own top-level statements reach, directly or through each other: the notebook's probes and pitfalls."""
    tree = ast.parse("\n\n".join(sources))
    defs = {node.name: node for node in tree.body if isinstance(node, _DEFS)}

    def names(node: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

    todo = [call, *(name for node in tree.body if not isinstance(node, _DEFS) for name in names(node))]
    reached: set[str] = set()
    while todo:
        name = todo.pop()
        if name in defs and name not in reached:
            reached.add(name)
            todo += names(defs[name])
    return [name for name in defs if name not in reached]


def reachable(sources: list[str], call: str) -> list[str]:
    """``sources`` without what :func:`unreachable` names (with the comment lines right above each); a cell left
    with nothing else goes too."""
    dropped = set(unreachable(sources, call))
    kept = []
    for source in sources:
        lines = source.splitlines()
        for node in reversed([n for n in ast.parse(source).body if isinstance(n, _DEFS) and n.name in dropped]):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            del lines[start:node.end_lineno]
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")
        if any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
            kept.append(text)
    return kept


def export(notebook_path: Path, out: Path) -> list[Path]:
    """Write ``out/main.py`` (and the files beside it) from the notebook at ``notebook_path``."""
    notebook = json.loads(Path(notebook_path).read_text())
    text, files = script(notebook, Path(notebook_path).name)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, content in {"main.py": text, **files}.items():
        path = out / file_name
        path.write_text(content)
        if content.startswith("#!"):
            path.chmod(0o755)
        written.append(path)
    return written


def exportable(folder: Path) -> list[str]:
    """The notebooks of ``folder`` that have a lesson to export."""
    return [p.name for p in sorted(folder.glob("[0-9][0-9]*-*.ipynb"))
            if json.loads(p.read_text()).get("metadata", {}).get("kit", {}).get("export")]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "export", help="write a notebook's lesson as main.py, a script that runs without the kit",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write the cells tagged 'lesson' of NOTEBOOK as OUT/main.py, with a command line whose options "
                    "default to the notebook's parameters. The script does not import the kit: run one process per "
                    "TensorFlow task, each with its own TF_CONFIG, as a cluster runs a job, e.g.\n\n"
                    "  TF_CONFIG='{\"cluster\": {\"worker\": [\"h0:2222\", \"h1:2222\"]}, "
                    "\"task\": {\"type\": \"worker\", \"index\": 0}}' python main.py --epochs 3\n\n"
                    "(and index 1 on the other host); for Horovod lessons, `horovodrun -np 2 python main.py`; "
                    "main.py's docstring says how its lesson runs.")
    parser.add_argument("notebook", nargs="?", help="a notebook file, or a lesson's name in the kit's notebooks "
                                                    "(e.g. 01-single-vs-multi-worker)")
    parser.add_argument("--out", default="take-home", help="the folder for main.py (default: take-home)")
    parser.add_argument("--list", action="store_true", help="list the notebooks that have a lesson to export")
    parser.set_defaults(func=lambda args: cmd_export(args, notebooks_dir()))


def cmd_export(args: argparse.Namespace, lessons: Path) -> int:
    import sys

    if args.list or not args.notebook:
        print("\n".join(exportable(lessons)))
        return 0
    path = Path(args.notebook)
    if not path.is_file():
        candidates = sorted(lessons.glob(f"{args.notebook.removesuffix('.ipynb')}*.ipynb"))
        if len(candidates) != 1:
            print(f"kit export: {args.notebook} is not a notebook file or the name of one lesson "
                  f"(found {len(candidates)}). Fix: give a path, or one of: {', '.join(exportable(lessons))}",
                  file=sys.stderr)
            return 2
        path = candidates[0]
    try:
        written = export(path, Path(args.out))
    except ExportError as error:
        print(f"kit export: {error}", file=sys.stderr)
        return 2
    for file in written:
        print(f"wrote {file}")
    run = json.loads(path.read_text())["metadata"]["kit"]["export"].get("run", "python main.py")
    print(f"run it from {args.out}/, one process per task:\n" + "\n".join("  " + line for line in run.splitlines()))
    return 0


def take_home(lesson: str, out: str | Path, lines: int = 14) -> Path:
    """A notebook's "Take it home" cell: export the kit's saved copy of ``lesson`` (e.g.
    ``"01-single-vs-multi-worker"``) to ``out``, then print how to run it and the first lines of main.py
    after its docstring. Returns main.py's path."""
    (path,) = notebooks_dir().glob(f"{lesson}*.ipynb")
    main = export(path, Path(out))[0]
    spec = json.loads(path.read_text())["metadata"]["kit"]["export"]
    print(f"$ kit export {lesson} --out {out}\n" + "\n".join(f"  {p}" for p in (main.parent.iterdir())))
    print("Run it, one process per task:\n" + "\n".join("  " + line for line in spec.get("run", "").splitlines()))
    text = main.read_text()
    code = text.split('"""', 2)[2].lstrip("\n") if text.startswith('"""') else text
    print(f"\n{main.name}:\n" + "\n".join(code.splitlines()[:lines]) + "\n...")
    return main
