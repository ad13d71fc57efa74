"""The ``kit`` command: ``kit tfconfig`` and ``kit demo`` over the same functions the notebooks use."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import tfconfig
from .errors import KitError, TFConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
DEMO_NOTEBOOK = NOTEBOOKS / "01-single-vs-multi-worker.ipynb"


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
        print(json.dumps(tfconfig.build(cluster, args.task, strategy=args.strategy), indent=args.indent))
        return 0
    except TFConfigError as e:
        print(f"kit tfconfig: {e}", file=sys.stderr)
        return 2


def cmd_demo(args: argparse.Namespace) -> int:
    import logging

    import papermill

    if args.verbose:  # papermill echoes the notebook's output through logging
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    output = out / f"01-single-vs-multi-worker_workers-{args.workers}.ipynb"
    parameters = {"N_WORKERS": args.workers, "PER_WORKER_BATCH": args.per_worker_batch,
                  "EPOCHS": args.epochs, "STEPS_PER_EPOCH": args.steps_per_epoch,
                  "OUT_DIR": str(out)}
    print(f"kit demo: running {DEMO_NOTEBOOK.name} with {parameters} -> {output}", flush=True)
    try:
        papermill.execute_notebook(str(DEMO_NOTEBOOK), str(output), parameters=parameters,
                                   cwd=str(NOTEBOOKS), kernel_name="python3",
                                   progress_bar=False, log_output=args.verbose)
    except papermill.PapermillExecutionError as e:
        print(f"kit demo: the notebook failed in cell {e.exec_count}: {e.ename}: {e.evalue}\n"
              f"The partial notebook, with the error at the top, is at {output}", file=sys.stderr)
        return 1
    from . import results

    summary = results.load(out / "demo-results.json")
    print(format_table(summary["rows"]))
    print(f"\nworkers' losses agree: {summary['workers_agree']}")
    print(f"notebook: {output}\nloss curves: {out / 'loss-curves.png'}")
    return 0 if summary["workers_agree"] else 1


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of the demo's per-task rows."""
    header = f"{'run':<14}{'task':<10}{'final loss':>11}{'accuracy':>10}{'examples/s':>12}{'wall s':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['run']:<14}{r['task']:<10}{r['loss']:>11.4f}{r['accuracy']:>10.4f}"
                     f"{r['examples_per_second']:>12.0f}{r['wall_seconds']:>8.1f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tfconfig", help="build or check a TF_CONFIG",
                       description="Print the TF_CONFIG of one task, or check one (exit 0 when "
                                   "valid, 2 with the reason otherwise).")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--cluster", help='cluster spec JSON (or @FILE), e.g. \'{"worker": ["h0:2222", "h1:2222"]}\'')
    group.add_argument("--check", metavar="JSON_OR_@FILE", help="TF_CONFIG to validate")
    p.add_argument("--task", help="the task, e.g. worker:1 or chief (with --cluster)")
    p.add_argument("--strategy", choices=sorted(set(tfconfig.STRATEGIES.values())),
                   help="also check what this strategy needs")
    p.add_argument("--indent", type=int, default=None, help="indent the printed JSON")
    p.set_defaults(func=cmd_tfconfig)

    p = sub.add_parser("demo", help="train the seeds' MNIST example on 1 and on N workers",
                       description="Runs notebooks/01-single-vs-multi-worker.ipynb with papermill: "
                                   "one worker, then MultiWorkerMirroredStrategy on N workers; "
                                   "prints a table and writes the notebook and a loss plot.")
    p.add_argument("--workers", type=int, default=2, help="workers in the distributed run (default 2)")
    p.add_argument("--per-worker-batch", type=int, default=64, help="batch per worker (default 64)")
    p.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    p.add_argument("--steps-per-epoch", type=int, default=70, help="steps per epoch (default 70)")
    p.add_argument("--out", default="out", help="output folder (default ./out)")
    p.add_argument("--quiet", dest="verbose", action="store_false", help="do not echo the notebook's output")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "tfconfig" and args.cluster is not None and not args.task:
        parser.error("--cluster needs --task, e.g. --task worker:0")
    try:
        return args.func(args)
    except KitError as e:
        print(f"kit {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
