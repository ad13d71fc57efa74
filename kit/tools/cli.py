"""The ``kit`` command: ``kit tfconfig``, ``kit demo``, ``kit notebooks``, ``kit export``, ``kit sweep``, ``kit plot``,
``kit bench``, ``kit faults`` and ``kit compat`` over the same functions the notebooks use."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

from ..core import tfconfig
from ..core.errors import KitError, TFConfigError
from ..core.files import shipped
from .export import notebooks_dir

#: What ``kit notebooks DIR`` copies: the lessons, their index, their figures, the sweeps' trial notebooks, and the
#: committed results notebook 10 reads.
NOTEBOOK_FILES = ("[0-9][0-9]*-*.ipynb", "README.md", "figures/*.svg", "trials/*.ipynb", "results/*.csv",
                  "results/*.json")


def notebook_files(source: Path | None = None) -> list[Path]:
    """The lessons' files, relative to their folder (see :data:`NOTEBOOK_FILES`)."""
    source = source or notebooks_dir()
    return sorted({path.relative_to(source) for pattern in NOTEBOOK_FILES for path in source.glob(pattern)})


def _read_json_arg(value: str) -> str:
    """``@path`` reads a file; anything else is the JSON text itself."""
    if value.startswith("@"):
        path = Path(value[1:])
        if not path.is_file():
            raise KitError(f"{path} does not exist. Fix: give @PATH of a TF_CONFIG JSON file, "
                           "or the JSON text itself")
        return path.read_text()
    return value


def cmd_tfconfig(args: argparse.Namespace) -> int:
    try:
        if args.check is not None:
            tfconfig.loads(_read_json_arg(args.check), strategy=args.strategy)
            print("valid TF_CONFIG")
            return 0
        try:
            cluster = json.loads(_read_json_arg(args.cluster))
        except json.JSONDecodeError as e:
            raise TFConfigError("cluster", f"is not valid JSON ({e.msg})",
                                'write e.g. --cluster \'{"worker": ["localhost:12345"]}\'') from None
        if args.export:
            print("\n".join(export_lines(cluster, args.task, strategy=args.strategy)))
            return 0
        print(json.dumps(tfconfig.build(cluster, args.task, strategy=args.strategy), indent=args.indent))
        return 0
    except TFConfigError as e:
        print(f"kit tfconfig: {e}", file=sys.stderr)
        return 2


def export_lines(cluster: dict, task: str | None = None, strategy: str | None = None) -> list[str]:
    """Shell lines that set each task's TF_CONFIG: ``# worker:0`` then ``export TF_CONFIG='...'``.

    Every task of ``cluster`` in the kit's order (chief, workers, ps, evaluator), or only ``task``.
    Each TF_CONFIG is validated first (a TFConfigError names the field and the fix), and quoted for
    POSIX shells, so the line pastes as it is on the task's machine before ``python main.py``.
    """
    names = [task] if task else tfconfig.cluster_tasks(cluster) if isinstance(cluster, dict) else []
    if not names:  # not a cluster: the same check as for one task says what is wrong, and the fix
        tfconfig.validate({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    lines = []
    for name in names:
        config = tfconfig.build(cluster, name, strategy=strategy)
        lines += [f"# {tfconfig.task_name(config['task']['type'], config['task']['index'])}",
                  f"export TF_CONFIG={shlex.quote(tfconfig.dumps(config))}"]
    return lines


def cmd_notebooks(args: argparse.Namespace) -> int:
    source = notebooks_dir()
    target = Path(args.directory)
    if target.resolve() == source.resolve():
        raise KitError(f"{target} is where the lessons come from. Fix: give another folder")
    files = notebook_files(source)
    present = [str(name) for name in files if (target / name).exists()]
    if present and not args.force:
        raise KitError(f"{target} already has {', '.join(present[:3])}"
                       f"{f' and {len(present) - 3} more' if len(present) > 3 else ''}. Fix: give a "
                       "new folder, or --force to overwrite them (your edits to them are lost)")
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, target / name)
    docs = carry_docs(target, [target / name for name in files if name.suffix == ".ipynb"])
    lessons = sum(1 for name in files if name.parent == Path(".") and name.suffix == ".ipynb")
    print(f"kit notebooks: copied {lessons} lessons and {len(files) - lessons + len(docs)} other files "
          f"(figures, index, trial notebooks, the docs they link to) from {source} to {target}")
    if importlib.util.find_spec("jupyterlab") is None:
        print("JupyterLab is not installed here; install it, then open them:\n"
              f"  {shlex.quote(sys.executable)} -m pip install 'jupyterlab==4.6.6'")
    print(f"open them with: jupyter lab {shlex.quote(str(target))}")
    return 0


#: A lesson's link into the repository's docs/ (a page, a profile folder), seen from the notebooks' folder.
DOCS_LINK = re.compile(r"\.\./docs/([\w./-]*\w)")


def docs_dir() -> Path:
    """The repository's docs/ (:func:`kit.core.files.shipped`)."""
    return shipped("docs", "security.md") or Path(__file__).resolve().parents[2] / "docs"


def carry_docs(target: Path, notebooks: list[Path]) -> list[Path]:
    """Make the copied ``notebooks``' links into ``../docs/`` point into ``target/docs/`` and copy what they name
    there (a page, or a folder such as notebook 11's profiles): the copy then has everything it references."""
    source, copied = docs_dir(), []
    for notebook in notebooks:
        text = notebook.read_text()
        for relative in sorted(set(DOCS_LINK.findall(text))):
            origin, destination = source / relative, target / "docs" / relative
            if origin.is_dir():
                shutil.copytree(origin, destination, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
                copied += [p for p in destination.rglob("*") if p.is_file()]
            elif origin.is_file():
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(origin, destination)
                copied.append(destination)
            else:
                raise KitError(f"{notebook.name} links to ../docs/{relative}, which is not in {source}. Fix: "
                               "reinstall the kit, or correct the link in the lesson")
        if DOCS_LINK.search(text):
            notebook.write_text(DOCS_LINK.sub(lambda m: f"docs/{m.group(1)}", text))
    return sorted(set(copied))


def cmd_horovod(args: argparse.Namespace) -> int:
    import subprocess

    script = Path(__file__).resolve().parent / "horovod_wheel.sh"
    return subprocess.run(["bash", str(script), sys.executable]).returncode


def cmd_sweep(args: argparse.Namespace) -> int:
    import logging

    from . import experiments
    if args.verbose:  # papermill echoes each notebook's output through logging
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    notebook = Path(args.notebook)
    grid = experiments.parse_grid_text(notebook, args.param or [])
    fixed = experiments.parse_grid_text(notebook, args.set or [])
    fixed = {name: values[0] for name, values in fixed.items()}
    out = Path(args.out or Path("out") / notebook.stem)
    points = experiments.validate_grid(notebook, grid, fixed)
    print(f"kit sweep: {len(points)} run(s) of {notebook.name} -> {out}", flush=True)
    table = experiments.sweep(notebook, grid, out, resume=args.resume, parameters=fixed,
                              timeout=args.timeout, log_output=args.verbose)
    shown = [c for c in table.columns if not table[c].map(lambda v: isinstance(v, (list, dict))).any()
             and c not in ("notebook", "error")]
    print(table[shown].to_string(index=False, max_colwidth=24))
    failed = table[table["status"] != "ok"]
    for _, row in failed.iterrows():
        print(f"failed: {row['notebook']}: {row['error']}", file=sys.stderr)
    reused = int(table["reused"].sum())
    print(f"\n{len(table) - len(failed)} ok ({reused} from an earlier run), {len(failed)} failed; "
          f"table: {out / experiments.TABLE_CSV} and {out / experiments.TABLE_JSON}")
    if args.plot and len(failed) < len(table):
        return cmd_plot(argparse.Namespace(directory=str(out))) or (1 if len(failed) else 0)
    return 1 if len(failed) else 0


def cmd_plot(args: argparse.Namespace) -> int:
    from . import plots
    for name, path in plots.plot_results(args.directory).items():
        print(f"{name}: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tfconfig", help="build or check a TF_CONFIG",
                       description="Print the TF_CONFIG of one task, the export lines of every task "
                                   "(--export), or check one (exit 0 when valid, 2 with the reason "
                                   "otherwise).")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--cluster", help='cluster spec JSON (or @FILE), e.g. \'{"worker": ["h0:2222", "h1:2222"]}\'')
    group.add_argument("--check", metavar="JSON_OR_@FILE", help="TF_CONFIG to validate")
    p.add_argument("--task", help="the task, e.g. worker:1 or chief (with --cluster)")
    p.add_argument("--strategy", choices=sorted(set(tfconfig.CHECKED_STRATEGIES.values())),
                   help="also check what this strategy needs")
    p.add_argument("--indent", type=int, default=None, help="indent the printed JSON")
    p.add_argument("--export", action="store_true",
                   help="print a shell line `export TF_CONFIG='...'` for every task of --cluster (or "
                        "only --task), each after a comment naming the task")
    p.set_defaults(func=cmd_tfconfig)

    from .demo import add_parser as add_demo
    add_demo(sub)

    p = sub.add_parser("notebooks", help="copy the lessons (with their figures) to a folder",
                       description="Copies the notebooks that came with the kit (the numbered lessons, "
                                   "their README index, figures/ and trials/) to DIR, to open and edit "
                                   "there, e.g. after `pip install` of a wheel. Exit 2, copying nothing, "
                                   "if DIR already holds one of them (unless --force).")
    p.add_argument("directory", metavar="DIR", help="where to copy them (created if missing)")
    p.add_argument("--force", action="store_true", help="overwrite notebooks already in DIR")
    p.set_defaults(func=cmd_notebooks)

    from .export import add_parser as add_export
    add_export(sub)

    p = sub.add_parser("horovod", help="build Horovod for this Python's TensorFlow and install it (cmake, g++)",
                       description="Builds Horovod 0.28.1 (TensorFlow and Gloo, CPU) from PyPI's source with the "
                                   "kit's patch for TensorFlow 2.21, once (cached in ~/.cache/kit/wheels; 2-5 minutes on "
                                   "2 cores), and installs it into this Python: what notebooks 09 and 09b need. In a "
                                   "checkout, `make horovod` does the same.")
    p.set_defaults(func=cmd_horovod)

    p = sub.add_parser("sweep", help="run a notebook once per point of a parameter grid (papermill)",
                       description="Runs NOTEBOOK once per combination of the -p values, each in a fresh "
                                   "kernel; keeps every executed notebook in --out under a name built "
                                   "from its parameters, and writes results.csv and results.json "
                                   "(parameters + the metrics the notebook records with "
                                   "kit.tools.experiments.record(RESULTS_PATH, ...)). A failed run is a row "
                                   "with its error; exit 1 if any run failed, 2 if the grid does not fit "
                                   "the notebook.",
                       epilog="example: kit sweep notebooks/trials/scaling-trial.ipynb -p workers 1 2 "
                              "-p per_worker_batch 64 256 -p lr_rule none linear sqrt --out out/scaling")
    p.add_argument("notebook", help="the notebook to run; with RESULTS_PATH in its parameters cell it records "
                                    "metrics, without it each row has the parameters, status and wall time")
    p.add_argument("-p", "--param", action="append", nargs="+", metavar="NAME VALUE",
                   help="a grid axis: a parameter of the notebook and one or more values (repeatable)")
    p.add_argument("--set", action="append", nargs=2, metavar=("NAME", "VALUE"),
                   help="a fixed parameter for every run, not part of the file names (repeatable)")
    p.add_argument("--out", default=None, help="output folder (default ./out/NOTEBOOK_NAME)")
    p.add_argument("--no-resume", dest="resume", action="store_false",
                   help="run every point again, even those already done")
    p.add_argument("--timeout", type=float, default=None, help="seconds any one cell may run")
    p.add_argument("--plot", action="store_true", help="then draw the figures, as kit plot DIR")
    p.add_argument("--verbose", action="store_true", help="echo the notebooks' output")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("plot", help="draw a sweep's figures as PNG next to its results",
                       description="Reads DIR/results.json (written by kit sweep or notebook 08) and "
                                   "saves accuracy-vs-batch.png, loss-vs-examples.png and throughput.png "
                                   "in DIR, each when the table has the columns it needs.")
    p.add_argument("directory", metavar="DIR", help="the folder a sweep wrote")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("bench", help="measure distribution efficiency, start-up, recovery, memory",
                       description="The benchmark (make bench): medians of interleaved repetitions, "
                                   "written as JSON and printed as a table with the goals.")
    _delegate(p, "bench")

    p = sub.add_parser("faults", help="kill a random task at a random step, N times, and measure",
                       description="Fault-injection trials: each on a fresh cluster, supervised, "
                                   "resumed with BackupAndRestore; counts leftover processes.")
    _delegate(p, "fault_trials")

    p = sub.add_parser("compat", help="measure which Keras works with which strategy (the table)",
                       description="The Keras compatibility table (make compat): runs each combination "
                                   "of Keras (tf-keras, Keras 3) x strategy x training API (model.fit, "
                                   "custom loop) for a few steps on a cluster, and prints the outcomes "
                                   "as a Markdown table or writes it to --out "
                                   "(docs/keras-compatibility.md is the committed one).")
    _delegate(p, "compat")

    p = sub.add_parser("sim-cluster", help="emulated hosts with Slurm and SSH on this machine (root only)",
                       description="A cluster in a box (kit.tools.sim_cluster): network namespaces with slurmd "
                                   "and sshd, munged and slurmctld here; for trying the Slurm and SSH profiles.")
    _delegate(p, "sim_cluster")
    return parser


def _delegate(parser: argparse.ArgumentParser, module: str) -> None:
    """Give a subcommand the arguments of a heavier module, imported only when it runs."""
    import importlib

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(f"kit.tools.{module}").run_from_args(args)

    importlib.import_module(f"kit.tools.{module}").add_arguments(parser)  # cheap: heavy imports are lazy
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "tfconfig" and args.cluster is not None and not args.task and not args.export:
        parser.error("--cluster needs --task, e.g. --task worker:0 (or --export for every task)")
    if args.command == "tfconfig" and args.export and args.cluster is None:
        parser.error("--export needs --cluster (it prints the export lines of a cluster's tasks)")
    try:
        return args.func(args)
    except KitError as e:
        print(f"kit {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
